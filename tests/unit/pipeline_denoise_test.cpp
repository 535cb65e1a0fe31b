// The step loop on one rank: true CFG combines the two passes as diffusers does, a group resumed
// from a stored step finishes exactly like an uninterrupted one, and micro-batched groups match
// single images within round-off.

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <map>

#include "parallel/partition.h"
#include "models/common/init.h"
#include "models/flux/latents.h"
#include "models/flux/transformer.h"
#include "pipeline/denoise.h"
#include "sched/flow_match_euler.h"
#include "support/step_loop.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

using Recorder = test::StepRecorder;

class Denoise : public test::TinyLoopTest {
 protected:
  void SetUp() override {
    make_loop(4, 6, 4, 6);
    root_.schedule = schedule_;
    root_.guidance = 3.5;
  }
  at::Tensor randn(at::IntArrayRef shape) { return at::randn(shape, gen_); }
  GroupInputs inputs(int64_t m) {
    GroupInputs in;
    in.latents = randn({m, setup_.image_tokens(), 64});
    in.text = randn({m, 6, 24});
    in.pooled = randn({m, 20});
    return in;
  }

  RootState root_;
  at::Generator gen_ = at::make_generator<at::CPUGeneratorImpl>(9);
};

TEST_F(Denoise, TrueCfgCombinesConditionalAndNegativePasses) {
  c10::InferenceMode guard;
  setup_.passes = 2;
  setup_.groups = {{0, 1, 0}};
  GroupInputs in = inputs(1);
  in.neg_text = randn({1, 6, 24});
  in.neg_pooled = randn({1, 20});
  const at::Tensor x0 = in.latents.clone();
  root_.groups = {in};
  root_.true_cfg_scale = 4.0;
  Recorder rec;
  root_.observer = &rec;
  denoise(setup_, *model_, *plan_, 0, nullptr, &root_);

  // Step 0 by hand: both passes, combined as neg + scale * (cond - neg), then the Euler step.
  flux::TransformerInputs t;
  t.latents = x0;
  t.timestep = at::full({1}, root_.schedule.timesteps[0]) / 1000;
  t.guidance = at::full({1}, 3.5f);
  at::Tensor txt_ids = flux::text_position_ids(6), img_ids = flux::image_position_ids(4, 6);
  t.text = in.text;
  t.pooled = in.pooled;
  at::Tensor cond = model_->forward(t, txt_ids, img_ids);
  t.text = in.neg_text;
  t.pooled = in.neg_pooled;
  at::Tensor neg = model_->forward(t, txt_ids, img_ids);
  at::Tensor v = neg + 4.0 * (cond - neg);
  EXPECT_TRUE(test::identical("true-CFG v at step 0", rec.vs[{0, 0}], v[0]));
  EXPECT_TRUE(test::identical("latents after step 0", rec.x[{0, 0}],
                              sched::euler_step(x0, v, root_.schedule.sigmas[0], root_.schedule.sigmas[1])[0]));
}

TEST_F(Denoise, ResumedGroupFinishesLikeAnUninterruptedOne) {
  c10::InferenceMode guard;
  setup_.groups = {{0, 1, 0}};
  GroupInputs in = inputs(1);
  root_.groups = {in};
  Recorder full;
  root_.observer = &full;
  denoise(setup_, *model_, *plan_, 0, nullptr, &root_);
  const at::Tensor uninterrupted = root_.groups[0].latents.clone();

  // Resume after step 1: start at step 2 from the latents stored for step 1.
  setup_.groups = {{0, 1, 2}};
  in.latents = full.x[{0, 1}].unsqueeze(0);
  root_.groups = {in};
  Recorder resumed;
  root_.observer = &resumed;
  denoise(setup_, *model_, *plan_, 0, nullptr, &root_);
  EXPECT_EQ(resumed.x.size(), 2u) << "only steps 2 and 3 run";
  EXPECT_TRUE(test::identical("final latents after resume", root_.groups[0].latents, uninterrupted));
}

TEST_F(Denoise, MicrobatchOfTwoMatchesTwoSingleImages) {
  c10::InferenceMode guard;
  GroupInputs both = inputs(2);
  setup_.groups = {{0, 2, 0}};
  root_.groups = {both};
  denoise(setup_, *model_, *plan_, 0, nullptr, &root_);
  const at::Tensor batched = root_.groups[0].latents.clone();
  setup_.groups = {{0, 1, 0}, {1, 1, 0}};
  GroupInputs a, b;
  a.latents = both.latents.narrow(0, 0, 1).clone();
  a.text = both.text.narrow(0, 0, 1);
  a.pooled = both.pooled.narrow(0, 0, 1);
  b.latents = both.latents.narrow(0, 1, 1).clone();
  b.text = both.text.narrow(0, 1, 1);
  b.pooled = both.pooled.narrow(0, 1, 1);
  root_.groups = {a, b};
  denoise(setup_, *model_, *plan_, 0, nullptr, &root_);
  EXPECT_TRUE(test::close_to("microbatch 2 vs single images", batched,
                             at::cat({root_.groups[0].latents, root_.groups[1].latents}, 0), test::kTolPipelineFp32));
}

}  // namespace
}  // namespace fluxmpi::pipeline
