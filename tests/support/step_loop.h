#pragma once
// Shared by the step-loop tests (pipeline_denoise_test, pipeline_patches_test,
// pipeline_handout_test): an observer that keeps every step's latents and noise prediction, the
// tiny transformer they run, and a fixture that builds it with its plan, setup and schedule.

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <utility>

#include "io/configs.h"
#include "models/common/init.h"
#include "models/flux/transformer.h"
#include "parallel/partition.h"
#include "pipeline/denoise.h"
#include "sched/flow_match_euler.h"

namespace fluxmpi::test {

/// Keeps (image, step) -> latents after the step and its noise prediction.
class StepRecorder : public pipeline::DenoiseObserver {
 public:
  void on_step(const pipeline::WorkGroup& g, int64_t step, const at::Tensor& latents, const at::Tensor& v) override {
    for (int64_t j = 0; j < g.count; ++j) {
      x[{g.first_image + j, step}] = latents[j].clone();
      vs[{g.first_image + j, step}] = v[j].clone();
    }
  }
  std::map<std::pair<int64_t, int64_t>, at::Tensor> x, vs;
};

/// 1 double + 2 single blocks, 2 heads of 16, guidance embedder: small enough for exact tests.
inline io::TransformerConfig tiny_loop_transformer() {
  io::TransformerConfig c;
  c.num_layers = 1;
  c.num_single_layers = 2;
  c.attention_head_dim = 16;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 24;
  c.pooled_projection_dim = 20;
  c.guidance_embeds = true;
  c.axes_dims_rope = {4, 6, 6};
  return c;
}

/// The part of `whole` that `blocks` holds (the embedders when `first`, the final layer when
/// `last`): the whole model's parameters by name, projections fused.
inline flux::FluxTransformer part_of(const flux::FluxTransformer& whole, const parallel::StageBlocks& blocks, bool first,
                                     bool last) {
  flux::FluxTransformer part(whole->config(), flux::TransformerPart{blocks.first, blocks.last + 1, first, last});
  auto all = whole->named_parameters(true);
  for (auto& p : part->named_parameters(true)) p.value().set_data(all[p.key()].clone());
  part->fuse_projections();
  return part;
}

/// Rank `rank` of `P`'s part of the tiny transformer (random weights, seed 4), and the plan that
/// gives it its blocks.
struct TinyLoopPart {
  parallel::StagePlan plan;
  flux::FluxTransformer part;
};
inline TinyLoopPart tiny_loop_part(int rank, int P) {
  const io::TransformerConfig tc = tiny_loop_transformer();
  flux::FluxTransformer whole(tc, flux::TransformerPart::whole(tc));
  nn::fill_random(*whole, 4);
  parallel::PlanRequest request;
  request.transformer = tc;
  request.world_size = P;
  parallel::StagePlan plan = parallel::StagePlan::make(request);
  flux::FluxTransformer part = part_of(whole, plan.blocks(rank), rank == 0, rank == P - 1);
  return TinyLoopPart{std::move(plan), part};
}

/// The MPI loop tests' setup: two one-image groups of 4 steps on a 4 x 6 latent after 5 text tokens.
inline pipeline::DenoiseSetup two_group_setup(int passes, int64_t patches) {
  pipeline::DenoiseSetup setup;
  setup.steps = 4;
  setup.text_tokens = 5;
  setup.latent_height = 4;
  setup.latent_width = 6;
  setup.passes = passes;
  setup.patches = patches;
  setup.groups = {pipeline::WorkGroup{0, 1, 0}, pipeline::WorkGroup{1, 1, 0}};
  return setup;
}

/// Rank 0's state for `setup`'s groups (one image each): FLUX's dynamic-shift schedule, guidance
/// 3.5, a true-CFG scale of 2.5, and random latents, text and pooled inputs, negative ones too,
/// drawn from `gen` group by group.
inline pipeline::RootState random_root(const pipeline::DenoiseSetup& setup, const io::TransformerConfig& tc,
                                       at::Generator& gen) {
  pipeline::RootState root;
  io::SchedulerConfig scheduler;
  scheduler.use_dynamic_shifting = true;
  root.schedule = sched::flux_schedule(scheduler, setup.steps, setup.image_tokens());
  root.guidance = 3.5;
  root.true_cfg_scale = 2.5;
  for (size_t g = 0; g < setup.groups.size(); ++g) {
    pipeline::GroupInputs in;
    in.latents = at::randn({1, setup.image_tokens(), tc.in_channels}, gen);
    in.text = at::randn({1, setup.text_tokens, tc.joint_attention_dim}, gen);
    in.pooled = at::randn({1, tc.pooled_projection_dim}, gen);
    in.neg_text = at::randn({1, setup.text_tokens, tc.joint_attention_dim}, gen);
    in.neg_pooled = at::randn({1, tc.pooled_projection_dim}, gen);
    root.groups.push_back(in);
  }
  return root;
}

/// A fixture with the tiny transformer (random weights, seed 4), its one-rank plan, a setup of
/// `steps` steps on a latent_height x latent_width latent after `text_tokens` text tokens, and
/// FLUX's dynamic-shift schedule for that many image tokens.
class TinyLoopTest : public testing::Test {
 protected:
  void make_loop(int64_t steps, int64_t text_tokens, int64_t latent_height, int64_t latent_width) {
    config_ = tiny_loop_transformer();
    model_ = flux::FluxTransformer(config_, flux::TransformerPart::whole(config_));
    nn::fill_random(*model_, 4);
    parallel::PlanRequest r;
    r.transformer = config_;
    plan_.emplace(parallel::StagePlan::make(r));
    setup_.steps = steps;
    setup_.text_tokens = text_tokens;
    setup_.latent_height = latent_height;
    setup_.latent_width = latent_width;
    io::SchedulerConfig sc;
    sc.use_dynamic_shifting = true;
    schedule_ = sched::flux_schedule(sc, setup_.steps, setup_.image_tokens());
  }
  io::TransformerConfig config_;
  flux::FluxTransformer model_{nullptr};
  std::optional<parallel::StagePlan> plan_;
  pipeline::DenoiseSetup setup_;
  sched::Schedule schedule_;
};

}  // namespace fluxmpi::test
