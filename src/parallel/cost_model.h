#pragma once
// The planner's cost model: what one rank running a slice of blocks is estimated to hold and
// compute, from the configs of a PlanRequest alone (docs/partition.md). Internal to src/parallel
// (partition.cpp, plan_advice.cpp).

#include <cstdint>

#include "parallel/controlnet_costs.h"
#include "parallel/decode_plan.h"
#include "parallel/partition.h"

namespace fluxmpi::parallel::detail {

inline uint64_t to_bytes(int64_t elements, int64_t dtype_bytes) { return static_cast<uint64_t>(elements * dtype_bytes); }

// Everything the estimates of one plan need, computed once from the request (which it keeps a
// reference to: the request must outlive it).
class CostModel {
 public:
  explicit CostModel(const PlanRequest& r);

  const TransformerParamCounts& params() const { return p_; }
  int64_t num_double() const { return r_.transformer.num_layers; }
  int64_t num_blocks() const { return r_.transformer.num_blocks(); }
  bool is_double(int64_t block) const { return block < num_double(); }
  uint64_t block_weight_bytes(int64_t block) const {
    if (r_.stored)
      return (is_double(block) ? r_.stored->double_blocks[block] : r_.stored->single_blocks[block - num_double()]).bytes(r_.dtype_bytes);
    return to_bytes(is_double(block) ? p_.double_block : p_.single_block, r_.dtype_bytes);
  }
  /// The whole transformer's weights as the ranks hold them.
  uint64_t total_weight_bytes() const { return r_.stored ? r_.stored->total(r_.dtype_bytes) : to_bytes(p_.total, r_.dtype_bytes); }
  uint64_t encoder_weight_bytes() const { return encoder_weight_bytes_; }
  uint64_t vae_weight_bytes() const { return vae_weight_bytes_; }
  uint64_t vae_activation_bytes() const { return vae_activation_bytes_; }
  uint64_t activation_bytes() const { return activation_bytes_; }
  uint64_t job_bytes() const { return job_bytes_; }
  bool encodes() const { return r_.clip || r_.t5 || r_.llm; }
  const ControlNetCosts& controlnet() const { return controlnet_; }
  /// The compute balance's load of a slice, in block runs per step: its blocks once per pass, and
  /// on rank 0 the ControlNets' blocks once per step.
  int64_t block_load(int rank, int64_t first, int64_t last) const {
    return (last - first + 1) * r_.passes + (rank == 0 ? controlnet_.block_runs() : 0);
  }

  /// The estimate of `rank` running global blocks first..last.
  StageEstimate estimate(int rank, int64_t first, int64_t last) const;

  VaeDecodeShape decode_shape() const;
  void latent_size(int64_t* h, int64_t* w) const;
  bool tiling_applies() const;
  int64_t tile_count() const;

 private:
  uint64_t transformer_activations() const;
  // Encoders run one after the other on one prompt at a time: the larger working set counts.
  uint64_t text_activations() const;
  // Rank 0 keeps every image's text embeddings (also gathered per microbatch group, so twice)
  // and its latents (the image's own and its group's) for the whole job.
  uint64_t job_buffers() const;

  const PlanRequest& r_;
  TransformerParamCounts p_;
  int64_t mlp_hidden_ = 0;
  double double_flops_ = 0, single_flops_ = 0, embedder_flops_ = 0, final_flops_ = 0, total_flops_ = 0;
  uint64_t activation_bytes_ = 0;
  uint64_t encoder_weight_bytes_ = 0, encoder_activation_bytes_ = 0;
  uint64_t vae_weight_bytes_ = 0, vae_activation_bytes_ = 0;
  uint64_t job_bytes_ = 0;
  ControlNetCosts controlnet_;
};

}  // namespace fluxmpi::parallel::detail
