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
///
/// Hand-out (`--stages`, several pipelines in one job): rank 0 of the pipeline (its leader) takes
/// groups from a WorkSource — the job's shared counter — and keeps at most `slots` of them in
/// flight, visiting them round robin: on each visit it collects what the group's previous step
/// needs and runs the next step; a group whose last step is back is finished (on_group_done) and
/// its slot is refilled at once. Without a source every group of the job is in flight from the
/// start, and the round robin is the step-major order above. The other ranks of the pipeline do
/// not know which groups their leader takes: they take the units in the order they arrive (the
/// header names the group's first image; each group's units must come in their own order, checked
/// against the header) until the leader's End marker.
///
/// Patch pipelining (PipeFusion; `patches` M > 1): a group's first `warmup_steps` W steps (from
/// its start step) run exact as above and fill each rank's per-block key/value caches
/// (flux::KvCache, one per block, group and pass); every later step cuts the image tokens into M
/// patches of latent rows that follow each other through the ranks as units of work, so that
/// rank 0 embeds patch p+1 while rank 1 runs patch p, and patch p of step k+1 starts as soon as
/// patch p of step k is back. In each attention layer patch p attends to the whole sequence: the
/// keys/values of patches < p from this step, of patches > p from the previous one (still in the
/// cache), its own fresh ones (written before it attends). The text tokens travel with patch 0,
/// so every image patch sees this step's text keys/values. Which keys/values are fresh depends on
/// the patch order alone, never on P, the partition or the timing.

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <vector>

#include "parallel/message.h"
#include "parallel/partition.h"
#include "pipeline/fault.h"
#include "models/flux/stage_model.h"
#include "sched/flow_match_euler.h"

namespace fluxmpi::pipeline {

/// A micro-batch: consecutive images denoised together (one message per step and pass).
struct WorkGroup {
  int64_t first_image = 0;
  int64_t count = 1;
  int64_t start_step = 0;  ///< first step still to run (> 0 for a resumed image)
};

/// A contiguous run of image tokens.
struct TokenRange {
  int64_t first = 0;
  int64_t count = 0;
};

/// The image tokens of `patches` patches of a (rows x cols) token grid whose patch 0 also carries
/// `text` text tokens: contiguous runs of whole rows, cut so that the patches hold as equal a number
/// of tokens as the rows allow, patch 0's text included. Patch p ends at the row nearest to the point
/// where (p + 1) / patches of all text + image tokens are reached (ties: the later row); each patch
/// keeps at least one row. Equal patches keep the ranks of a pipelined step equally busy
/// (docs/architecture.md, "Patch pipelining").
std::vector<TokenRange> patch_ranges(int64_t rows, int64_t cols, int64_t patches, int64_t text = 0);

/// What every rank knows of the job: the shape of every message and the order of the work.
struct DenoiseSetup {
  int64_t steps = 0;        ///< N
  int64_t text_tokens = 0;  ///< S
  int64_t latent_height = 0, latent_width = 0;
  /// Kontext: the reference image's latent size; its tokens follow the image tokens in every call
  /// (0: none). Only exact steps (no patches).
  int64_t reference_height = 0, reference_width = 0;
  int passes = 1;           ///< 2 with true CFG (conditional, then negative prompt)
  int64_t patches = 1;       ///< M: patches per pipelined step; 1 = every step exact
  int64_t warmup_steps = 1;  ///< W >= 1: exact steps at the start of each group's run
  std::vector<WorkGroup> groups;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  Fault fault;  ///< reliability tests only (FLUXMPI_FAULT, FLUXMPI_DELAY)
  /// The world rank of this pipeline's rank 0: faults name world ranks (0 with one pipeline).
  int first_world_rank = 0;

  int64_t image_tokens() const { return (latent_height / 2) * (latent_width / 2); }
  int64_t reference_tokens() const { return (reference_height / 2) * (reference_width / 2); }
  /// Whether `step` of `group` runs exact (the whole sequence at once): always with one patch,
  /// else during the group's first W steps from its start step (a resumed group warms up again).
  bool exact_step(const WorkGroup& group, int64_t step) const {
    return patches <= 1 || step < group.start_step + warmup_steps;
  }
};

/// Rank 0's inputs of one group, on the rank's device, in the run dtype.
struct GroupInputs {
  at::Tensor latents;     ///< [m, L, 4C], updated in place of the loop
  at::Tensor text;        ///< [m, S, joint_attention_dim]
  at::Tensor pooled;      ///< [m, pooled_projection_dim]
  at::Tensor neg_text;    ///< true CFG only
  at::Tensor neg_pooled;
  /// Fill and Control: [m, L, E] features appended to the latents' on every call (the transformer's
  /// input is [m, L, 4C + E]); undefined otherwise.
  at::Tensor features;
  /// Kontext: [m, Li, 4C] reference tokens appended to the latents' tokens; undefined otherwise.
  at::Tensor reference;

  /// Every field, in a fixed order: what a pipeline leader receives of a group from world rank 0
  /// (app/leader_job.cpp). A field a mode adds is listed here too.
  std::vector<at::Tensor*> tensors() { return {&latents, &text, &pooled, &neg_text, &neg_pooled, &features, &reference}; }
};

/// Rank 0 is told about every finished step of a group.
class DenoiseObserver {
 public:
  virtual ~DenoiseObserver() = default;
  /// After step `step` of `group`: latents = x_{step+1}, v = the (combined) noise prediction.
  virtual void on_step(const WorkGroup& group, int64_t step, const at::Tensor& latents, const at::Tensor& v) = 0;
};

/// Where a pipeline leader takes its work groups from (`--stages`: the job's shared counter).
class WorkSource {
 public:
  virtual ~WorkSource() = default;
  /// The index into DenoiseSetup::groups of the next group to run; none when the job has none left.
  virtual std::optional<size_t> next() = 0;
};

/// What only rank 0 holds.
struct RootState {
  sched::Schedule schedule;
  std::optional<double> guidance;  ///< guidance-distilled models only
  double true_cfg_scale = 1.0;
  std::vector<GroupInputs> groups;  ///< one per DenoiseSetup::groups entry
  DenoiseObserver* observer = nullptr;
  /// Applied to each scheduler step's output before anyone sees it (inpaint's blend): the group's
  /// index, the step, the image tokens the rows cover, and the stepped rows [m, rows, 4C].
  std::function<at::Tensor(size_t group, int64_t step, TokenRange rows, const at::Tensor& stepped)> after_step;
  /// Dynamic hand-out: groups come from `source` (null: every group, all in flight from the start,
  /// in order), at most `slots` in flight (0: no limit). GroupInputs of the groups never taken may
  /// be left undefined.
  WorkSource* source = nullptr;
  size_t slots = 0;
  /// After a group's last step: its final latents are in groups[group].latents.
  std::function<void(size_t group)> on_group_done;
};

/// Runs this rank's share of every step of every group its pipeline takes. `plan` and `rank` are
/// the pipeline's (S ranks; `messenger` over the pipeline's communicator, null when S = 1).
/// `root` is required on rank 0 and ignored elsewhere.
void denoise(const DenoiseSetup& setup, const flux::StageModel& part, const parallel::StagePlan& plan, int rank,
             parallel::Messenger* messenger, RootState* root);

}  // namespace fluxmpi::pipeline
