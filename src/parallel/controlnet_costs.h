#pragma once
// What ControlNets add to the planner's estimates (docs/partition.md, "ControlNets"). Internal to
// src/parallel (cost_model.cpp, partition.cpp).
//
// Rank 0 of a pipeline loads every ControlNet and runs each run once per step, before its own
// blocks: its compute counts its blocks like transformer blocks (per microbatch, once per step,
// where the transformer's blocks run once per pass), its weights and the embedded control images
// of the whole job count on rank 0. Residual samples [m, L, D] in flight: rank 0 holds the merged
// samples of a unit, one run's samples while it merges them, and the stacked copies it sends the
// other ranks (for at most min(groups, P) units); every other rank holds the samples its blocks add
// for one unit. With patches each run's blocks keep key/value buffers like the transformer's.

#include <cstdint>
#include <string>

#include "parallel/partition.h"

namespace fluxmpi::parallel::detail {

class ControlNetCosts {
 public:
  explicit ControlNetCosts(const PlanRequest& r);

  bool present() const { return r_.controlnet.has_value(); }
  /// Rank 0's ControlNet weights (every net once), in the run dtype.
  uint64_t weight_bytes() const { return weight_bytes_; }
  /// ControlNet FLOPs of one step (one microbatch): every run's embedders and blocks.
  double step_flops() const { return step_flops_; }
  /// Blocks run per step over every run, for the compute balance (in transformer blocks).
  int64_t block_runs() const { return block_runs_; }
  /// Residuals and the rest (embedded control images, key/value buffers on rank 0) held by `rank`
  /// running global blocks first..last while denoising.
  uint64_t denoise_bytes(int rank, int64_t first, int64_t last) const;
  /// The --dry-run line.
  std::string describe() const;

 private:
  uint64_t sample_bytes() const;  // one sample [m, L, D]
  const PlanRequest& r_;
  uint64_t weight_bytes_ = 0;
  double step_flops_ = 0;
  int64_t block_runs_ = 0;
  int64_t largest_run_ = 0;  // the most samples one run makes
};

}  // namespace fluxmpi::parallel::detail
