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
