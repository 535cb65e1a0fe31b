#pragma once
/// The denoising loop of one rank (DESIGN.md §3), the same code for P = 1 and P > 1.
///
///   rank 0     embed -> blocks[slice 0] -> send ──┐            (P = 1: -> final layer -> v)
///   rank r        recv -> blocks[slice r] -> send ──┐
///   rank P-1         recv -> blocks -> norm_out -> proj_out -> send v to rank 0
///   rank 0     recv v -> Euler step of the scheduler
///
/// Images flow through the ranks like the micro-batches of a GPipe schedule: rank 0 walks the
/// steps in order and, within a step, the work groups in order; it receives a group's v of the
/// previous step only when it comes back to that group, so while the other ranks work on group g
/// it embeds and runs groups g+1, g+2, ... (with at least P groups every rank is busy in the
/// steady state). Every group is computed alone, so results do not depend on P nor on the order.

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "parallel/message.h"
#include "parallel/partition.h"
#include "pipeline/fault.h"
#include "models/flux/transformer.h"
#include "sched/flow_match_euler.h"

namespace fluxmpi::pipeline {

/// A micro-batch: consecutive images denoised together (one message per step and pass).
struct WorkGroup {
  int64_t first_image = 0;
  int64_t count = 1;
  int64_t start_step = 0;  ///< first step still to run (> 0 for a resumed image)
};

/// What every rank knows of the job: the shape of every message and the order of the work.
struct DenoiseSetup {
  int64_t steps = 0;        ///< N
  int64_t text_tokens = 0;  ///< S
  int64_t latent_height = 0, latent_width = 0;
  int passes = 1;           ///< 2 with true CFG (conditional, then negative prompt)
  std::vector<WorkGroup> groups;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  Fault fault;  ///< reliability tests only (FLUXMPI_FAULT)

  int64_t image_tokens() const { return (latent_height / 2) * (latent_width / 2); }
};

/// Rank 0's inputs of one group, on the rank's device, in the run dtype.
struct GroupInputs {
  at::Tensor latents;     ///< [m, L, 4C], updated in place of the loop
  at::Tensor text;        ///< [m, S, joint_attention_dim]
  at::Tensor pooled;      ///< [m, pooled_projection_dim]
  at::Tensor neg_text;    ///< true CFG only
  at::Tensor neg_pooled;
};

/// Rank 0 is told about every finished step of a group.
class DenoiseObserver {
 public:
  virtual ~DenoiseObserver() = default;
  /// After step `step` of `group`: latents = x_{step+1}, v = the (combined) noise prediction.
  virtual void on_step(const WorkGroup& group, int64_t step, const at::Tensor& latents, const at::Tensor& v) = 0;
};

/// What only rank 0 holds.
struct RootState {
  sched::Schedule schedule;
  std::optional<double> guidance;  ///< guidance-distilled models only
  double true_cfg_scale = 1.0;
  std::vector<GroupInputs> groups;  ///< one per DenoiseSetup::groups entry
  DenoiseObserver* observer = nullptr;
};

/// Runs this rank's share of every step of every group. `messenger` may be null when P = 1.
/// `root` is required on rank 0 and ignored elsewhere.
void denoise(const DenoiseSetup& setup, const flux::FluxTransformer& part, const parallel::StagePlan& plan, int rank,
             parallel::Messenger* messenger, RootState* root);

}  // namespace fluxmpi::pipeline
