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
/// and so do reference tokens (Kontext's, FLUX.2's multi-reference: they follow the image tokens in
/// the sequence, flux::KvCache::tail), so every image patch sees this step's text and reference
/// keys/values. Which keys/values are fresh depends on the patch order alone, never on P, the
/// partition or the timing.

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

/// Where ControlNet residuals go; the same on every rank of a pipeline.
struct ControlRouting {
  /// Per global block: the merged residual sample it adds (io::ResidualLayout), or -1. Empty: no
  /// ControlNet.
  std::vector<int64_t> sample_of_block;
  /// Per step: whether its units carry residuals (a ControlNet acts at that step).
  std::vector<bool> active_steps;

  bool enabled() const { return !sample_of_block.empty(); }
  bool active(int64_t step) const {
    return enabled() && step >= 0 && step < static_cast<int64_t>(active_steps.size()) && active_steps[step];
  }
  /// The distinct samples that global blocks [first, last] add, ascending.
  std::vector<int64_t> samples_of(int64_t first, int64_t last) const;
};

/// The size of a VAE latent (twice its token grid).
struct LatentSize {
  int64_t height = 0, width = 0;
  int64_t tokens() const { return (height / 2) * (width / 2); }
  bool operator==(const LatentSize& o) const { return height == o.height && width == o.width; }
};

/// What every rank knows of the job: the shape of every message and the order of the work.
struct DenoiseSetup {
  int64_t steps = 0;        ///< N
  int64_t text_tokens = 0;  ///< S
  int64_t latent_height = 0, latent_width = 0;
  /// Reference images (Kontext's one, FLUX.2's multi-reference): each one's latent size, in order.
  /// Their tokens follow the image tokens in every call, with the ids the model gives them
  /// (flux::StageModel::reference_position_ids); in a pipelined step they travel with patch 0.
  std::vector<LatentSize> references;
  int passes = 1;           ///< 2 with true CFG (conditional, then negative prompt)
  int64_t patches = 1;       ///< M: patches per pipelined step; 1 = every step exact
  int64_t warmup_steps = 1;  ///< W >= 1: exact steps at the start of each group's run
  std::vector<WorkGroup> groups;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  Fault fault;  ///< reliability tests only (FLUXMPI_FAULT, FLUXMPI_DELAY)
  /// The world rank of this pipeline's rank 0: faults name world ranks (0 with one pipeline).
  int first_world_rank = 0;
  ControlRouting control;  ///< ControlNet residuals (none by default)
  /// Ranks 1..S-1 run their blocks once on zeros while they wait for their first message
  /// (Worker::warm_up in denoise.cpp): for ranks with cores of their own or a GPU, not sharing rank 0's.
  bool warm_up_while_waiting = false;

  int64_t image_tokens() const { return (latent_height / 2) * (latent_width / 2); }
  int64_t reference_tokens() const {
    int64_t n = 0;
    for (const LatentSize& r : references) n += r.tokens();
    return n;
  }
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
  /// Kontext, FLUX.2 multi-reference: [m, R, 4C] reference tokens appended to the latents' tokens
  /// (every reference's, in order); undefined otherwise.
  at::Tensor reference;
  /// ControlNets: [m, K, L, 4C] the control latents of the K runs, or [m, K, 3, H, W] their pixels
  /// (XLabs layout); the group's ResidualSource takes them before the loop (undefined then).
  at::Tensor controlnet;

  /// Every field, in a fixed order: what a pipeline leader receives of a group from world rank 0
  /// (app/leader_job.cpp). A field a mode adds is listed here too.
  std::vector<at::Tensor*> tensors() {
    return {&latents, &text, &pooled, &neg_text, &neg_pooled, &features, &reference, &controlnet};
  }
};

/// Rank 0 is told about every finished step of a group.
class DenoiseObserver {
 public:
  virtual ~DenoiseObserver() = default;
  /// After step `step` of `group`: latents = x_{step+1}, v = the (combined) noise prediction.
  virtual void on_step(const WorkGroup& group, int64_t step, const at::Tensor& latents, const at::Tensor& v) = 0;
};

/// One unit of work, as rank 0 asks its ControlNets for the unit's residuals.
struct ResidualRequest {
  size_t group = 0;    ///< index into DenoiseSetup::groups
  int64_t step = 0;
  int32_t patch = -1;  ///< -1: the whole sequence
  int64_t text = 0;    ///< text tokens the unit carries: all of them, or 0 (patches after the first)
  TokenRange image;    ///< its image tokens
  bool fills = false;  ///< an exact step before a pipelined one: key/value caches start here
  bool last = false;   ///< the group's last unit of its last step: its caches may go
  /// Where the unit's first token sits in a sequence of `text_tokens` text tokens, then the image.
  int64_t offset(int64_t text_tokens) const { return text > 0 ? 0 : text_tokens + image.first; }
};

/// Rank 0's ControlNets (pipeline/control_residuals.h).
class ResidualSource {
 public:
  virtual ~ResidualSource() = default;
  /// Before the loop: takes every group's control inputs (GroupInputs::controlnet, left undefined).
  virtual void take_inputs(std::vector<GroupInputs>& groups) = 0;
  /// The merged residual samples of one unit, [m, image.count, D] each, indexed as
  /// ControlRouting::sample_of_block counts them; `in` is the unit's conditional (pass 0) input.
  virtual std::vector<at::Tensor> samples(const ResidualRequest& request, const flux::TransformerInputs& in) = 0;
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
  /// The ControlNets, when DenoiseSetup::control is enabled.
  ResidualSource* control = nullptr;
};

/// Runs this rank's share of every step of every group its pipeline takes. `plan` and `rank` are
/// the pipeline's (S ranks; `messenger` over the pipeline's communicator, null when S = 1).
/// `root` is required on rank 0 and ignored elsewhere.
void denoise(const DenoiseSetup& setup, const flux::StageModel& part, const parallel::StagePlan& plan, int rank,
             parallel::Messenger* messenger, RootState* root);

}  // namespace fluxmpi::pipeline
