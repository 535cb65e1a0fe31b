// Patch pipelining (PipeFusion) in one process: the order in which an attention layer updates and
// reads its key/value buffer, checked by hand on one layer; the patches' token ranges; and the step
// loop: --patches 1 and a warm-up covering every step are the exact loop bit for bit, warm-up
// steps are exact, pipelined steps are deterministic.

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <map>

#include "core/error.h"
#include "models/common/init.h"
#include "models/flux/attention.h"
#include "models/flux/latents.h"
#include "parallel/partition.h"
#include "models/flux/transformer.h"
#include "pipeline/denoise.h"
#include "sched/flow_match_euler.h"
#include "support/step_loop.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

TEST(PatchRanges, WholeRowsAsEqualAsTheyAllow) {
  auto r = patch_ranges(5, 3, 2);  // 5 rows of 3 tokens: 3 rows, then 2
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].first, 0);
  EXPECT_EQ(r[0].count, 9);
  EXPECT_EQ(r[1].first, 9);
  EXPECT_EQ(r[1].count, 6);
  r = patch_ranges(4, 6, 4);
  ASSERT_EQ(r.size(), 4u);
  for (int64_t p = 0; p < 4; ++p) {
    EXPECT_EQ(r[p].first, 6 * p);
    EXPECT_EQ(r[p].count, 6);
  }
  EXPECT_EQ(patch_ranges(7, 2, 1).front().count, 14);
  EXPECT_THROW(patch_ranges(3, 2, 4), InternalError);
}

TEST(PatchRanges, TheTextOfPatchZeroCountsTowardsEqualPatches) {
  // 32 rows of 32 tokens and 128 text tokens (the bench's 512^2): 1152 tokens, 288 a patch.
  auto r = patch_ranges(32, 32, 4, 128);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].first, 0);
  EXPECT_EQ(r[0].count, 5 * 32);  // + 128 text tokens = 288
  for (int64_t p = 1; p < 4; ++p) {
    EXPECT_EQ(r[p].first, (5 + 9 * (p - 1)) * 32);
    EXPECT_EQ(r[p].count, 9 * 32);
  }
  r = patch_ranges(32, 32, 2, 128);  // 576 and 576
  EXPECT_EQ(r[0].count, 14 * 32);
  EXPECT_EQ(r[1].count, 18 * 32);
  // Where the exact share falls between rows, the nearest row: 10 rows of 4 and 6 text tokens in 3
  // patches: 46 tokens, a third after 15.3 and two after 30.7, i.e. 9.3 and 24.7 image tokens,
  // 2.33 and 6.17 rows: cuts after rows 2 and 6.
  r = patch_ranges(10, 4, 3, 6);
  EXPECT_EQ(r[0].count, 8);
  EXPECT_EQ(r[1].first, 8);
  EXPECT_EQ(r[1].count, 16);
  EXPECT_EQ(r[2].count, 16);
  // More text than a patch's share: patch 0 still keeps one row, and every later patch one too.
  r = patch_ranges(4, 2, 4, 100);
  for (int64_t p = 0; p < 4; ++p) EXPECT_EQ(r[p].count, 2) << "patch " << p;
  r = patch_ranges(6, 1, 2, 5);  // 11 tokens: patch 0 = 5 text + 1 row, patch 1 = 5 rows
  EXPECT_EQ(r[0].count, 1);
  EXPECT_EQ(r[1].count, 5);
}

// One attention layer of one block, 1 head of 2 dims, 3 tokens, RoPE the identity and q = 0: every
// query weighs all keys equally, so each output row is the mean of the value rows it attends to,
// and which rows are fresh can be read off the numbers.
TEST(PatchKvCache, EachPatchWritesItsOwnRowsBeforeAttending) {
  c10::InferenceMode guard;
  flux::RopeTables rope{at::ones({3, 2}), at::zeros({3, 2})};
  auto window = [&](int64_t first, int64_t n) {
    return flux::RopeTables{rope.cos.narrow(0, first, n), rope.sin.narrow(0, first, n)};
  };
  auto values = [](std::vector<float> rows) {  // [1, n, 1, 2], both components equal
    at::Tensor t = at::tensor(rows).view({1, -1, 1, 1});
    return at::cat({t, t}, 3);
  };
  auto mean = [](float x) { return at::full({1, 1, 2}, x); };
  flux::KvCache kv{at::zeros({1, 3, 1, 2}), at::zeros({1, 3, 1, 2}), 0};

  // Step 0, exact: all three tokens at once fill the buffer; each row = (3 + 6 + 9) / 3.
  at::Tensor k0 = at::arange(6, at::kFloat).view({1, 3, 1, 2});
  at::Tensor out = flux::rope_attention(at::zeros({1, 3, 1, 2}), k0, values({3, 6, 9}), rope, &kv);
  EXPECT_TRUE(test::identical("exact step output", out, at::full({1, 3, 2}, 6.0f)));
  EXPECT_TRUE(test::identical("keys after the exact step", kv.k, k0));
  EXPECT_TRUE(test::identical("values after the exact step", kv.v, values({3, 6, 9})));

  // Step 1 in three patches of one token, values now 30, 60, 90.
  const std::vector<float> fresh = {30, 60, 90};
  const std::vector<float> expected = {(30 + 6 + 9) / 3.0f, (30 + 60 + 9) / 3.0f, (30 + 60 + 90) / 3.0f};
  const std::vector<std::vector<float>> buffer = {{30, 6, 9}, {30, 60, 9}, {30, 60, 90}};
  for (int64_t p = 0; p < 3; ++p) {
    kv.offset = p;
    at::Tensor k = at::full({1, 1, 1, 2}, 100.0f + static_cast<float>(p));
    out = flux::rope_attention(at::zeros({1, 1, 1, 2}), k, values({fresh[p]}), window(p, 1), &kv);
    EXPECT_TRUE(test::identical("output of patch " + std::to_string(p), out, mean(expected[p])));
    EXPECT_TRUE(test::identical("values after patch " + std::to_string(p), kv.v, values(buffer[p])));
    EXPECT_TRUE(test::identical("key row of patch " + std::to_string(p), kv.k.narrow(1, p, 1), k));
    if (p + 1 < 3)
      EXPECT_TRUE(test::identical("stale key rows after patch " + std::to_string(p), kv.k.narrow(1, p + 1, 2 - p),
                                  k0.narrow(1, p + 1, 2 - p)));
  }
}

using Recorder = test::StepRecorder;

// A transformer of 1 double + 2 single blocks on a 6 x 6 latent (3 rows of 3 image tokens).
class PatchedLoop : public test::TinyLoopTest {
 protected:
  void SetUp() override {
    make_loop(4, 5, 6, 6);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
    in_.latents = at::randn({2, setup_.image_tokens(), 64}, gen);
    in_.text = at::randn({2, 5, 24}, gen);
    in_.pooled = at::randn({2, 20}, gen);
    in_.neg_text = at::randn({2, 5, 24}, gen);
    in_.neg_pooled = at::randn({2, 20}, gen);
  }

  // Runs the loop on two images (one group) with M patches and W warm-up steps.
  Recorder run(int64_t patches, int64_t warmup, int passes = 1) {
    c10::InferenceMode guard;
    DenoiseSetup s = setup_;
    s.patches = patches;
    s.warmup_steps = warmup;
    s.passes = passes;
    s.groups = {{0, 2, 0}};
    RootState root;
    root.schedule = schedule_;
    root.guidance = 3.5;
    root.true_cfg_scale = 3.0;
    root.groups = {in_};
    Recorder rec;
    root.observer = &rec;
    denoise(s, *model_, *plan_, 0, nullptr, &root);
    EXPECT_EQ(rec.x.size(), 8u) << "every step of both images is observed";
    return rec;
  }
  static at::Tensor final_latents(Recorder& r) { return at::stack({r.x[{0, 3}], r.x[{1, 3}]}); }

  GroupInputs in_;
};

TEST_F(PatchedLoop, OnePatchOrAWarmUpCoveringEveryStepIsTheExactLoop) {
  Recorder exact = run(1, 1);
  for (auto [m, w] : {std::pair<int64_t, int64_t>{1, 3}, {3, 4}, {2, 9}}) {
    Recorder r = run(m, w);
    const std::string what = "--patches " + std::to_string(m) + " --warmup-steps " + std::to_string(w);
    EXPECT_TRUE(test::identical(what + ": final latents", final_latents(r), final_latents(exact)));
    EXPECT_TRUE(test::identical(what + ": v of step 2", r.vs[{1, 2}], exact.vs[{1, 2}]));
  }
}

TEST_F(PatchedLoop, WarmUpStepsAreExactAndPipelinedStepsDeterministic) {
  for (int passes : {1, 2}) {
    Recorder exact = run(1, 1, passes);
    Recorder a = run(3, 2, passes);
    Recorder b = run(3, 2, passes);
    const std::string what = passes == 2 ? " (true CFG)" : "";
    for (int64_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(test::identical("warm-up step 0" + what, a.x[{i, 0}], exact.x[{i, 0}]));
      EXPECT_TRUE(test::identical("warm-up step 1" + what, a.x[{i, 1}], exact.x[{i, 1}]));
      for (int64_t step = 2; step < 4; ++step)
        EXPECT_TRUE(test::identical("pipelined step " + std::to_string(step) + " run twice" + what, a.x[{i, step}],
                                    b.x[{i, step}]));
    }
    // Stale keys and values change the pipelined steps' noise prediction (and only those).
    EXPECT_GT((a.vs[{0, 2}] - exact.vs[{0, 2}]).abs().max().item<float>(), 0.0f) << what;
    EXPECT_TRUE(test::identical("v of warm-up step 1" + what, a.vs[{0, 1}], exact.vs[{0, 1}]));
  }
}

}  // namespace
}  // namespace fluxmpi::pipeline
