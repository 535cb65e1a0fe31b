// The step loop's warm-up on ranks 1..S-1 (run with 2 and 3 ranks): while a rank waits for its
// first message it runs its blocks once on zeros, and stops after the block during which that
// message arrives. The final latents must be the same bits with and without it, and the same as
// one process (equal threads per rank); the warm-up is exactly one more call of the rank's blocks.
// Tiny random model, no files.

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "models/flux/transformer.h"
#include "mpi_test_main.h"
#include "parallel/message.h"
#include "parallel/partition.h"
#include "parallel/pipelines.h"
#include "pipeline/denoise.h"
#include "support/step_loop.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

// A rank's part that counts its calls of run_blocks and the blocks each call ran. With `start`,
// every rank's first call begins with a barrier on that communicator (the loop's messages go on
// another): rank 0 sends nothing before each downstream rank has begun its warm-up. With `hold`,
// the first call then waits for the rank's first message, so that the warm-up must stop after its
// first block.
class CountingPart final : public flux::StageModel {
 public:
  CountingPart(const flux::StageModel& inner, const parallel::Messenger* messenger, int from,
               const parallel::Communicator* start, bool hold)
      : inner_(inner), messenger_(messenger), from_(from), start_(start), hold_(hold) {}

  flux::StreamState embed(const flux::TransformerInputs& in) const override { return inner_.embed(in); }
  at::Tensor text_position_ids(int64_t text_tokens) const override { return inner_.text_position_ids(text_tokens); }
  at::Tensor image_position_ids(int64_t h, int64_t w) const override { return inner_.image_position_ids(h, w); }
  at::Tensor reference_position_ids(int64_t index, int64_t h, int64_t w) const override {
    return inner_.reference_position_ids(index, h, w);
  }
  flux::RopeTables rope(const at::Tensor& txt_ids, const at::Tensor& img_ids) const override {
    return inner_.rope(txt_ids, img_ids);
  }
  void run_blocks(flux::StreamState& state, const flux::RopeTables& rope, const flux::BlockObserver& observe,
                  std::vector<flux::KvCache>* kv, const flux::BlockResiduals* residuals) const override {
    if (blocks_per_call.empty()) {
      if (start_ != nullptr) start_->quiet_barrier();
      if (hold_)
        while (!messenger_->arrived(from_)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    blocks_per_call.push_back(0);
    inner_.run_blocks(
        state, rope,
        [&](const std::string& name, const flux::StreamState& s) {
          ++blocks_per_call.back();
          if (observe) observe(name, s);
        },
        kv, residuals);
  }
  std::vector<flux::KvCache> kv_caches(int64_t batch, int64_t tokens, const at::TensorOptions& options) const override {
    return inner_.kv_caches(batch, tokens, options);
  }
  at::Tensor final_layer(const flux::StreamState& state, at::Tensor* normed) const override {
    return inner_.final_layer(state, normed);
  }
  int64_t stream_dim() const override { return inner_.stream_dim(); }
  int64_t output_channels() const override { return inner_.output_channels(); }
  int64_t modulation_dim() const override { return inner_.modulation_dim(); }

  mutable std::vector<int64_t> blocks_per_call;

 private:
  const flux::StageModel& inner_;
  const parallel::Messenger* messenger_;
  int from_;
  const parallel::Communicator* start_;
  bool hold_;
};

struct Scenario {
  int64_t patches = 1;
  int passes = 1;
  bool warm_up = false;
  bool hold = false;  // the downstream ranks' first call waits for their first message
};

struct Outcome {
  std::vector<at::Tensor> latents;  // rank 0: each group's final latents
  std::vector<int64_t> blocks_per_call;
  int64_t blocks_held = 0;
  int64_t units = 0;  // the units this rank ran for the groups (passes counted)
};

Outcome run(const Scenario& sc, const parallel::Communicator* world, int rank, int P) {
  c10::InferenceMode guard;
  const io::TransformerConfig tc = test::tiny_loop_transformer();
  const test::TinyLoopPart tiny = test::tiny_loop_part(rank, P);
  const parallel::StagePlan& plan = tiny.plan;
  const flux::FluxTransformer& part = tiny.part;

  DenoiseSetup setup = test::two_group_setup(sc.passes, sc.patches);
  setup.warm_up_while_waiting = sc.warm_up;

  std::optional<parallel::Messenger> messenger;
  std::optional<parallel::PipelineComms> start;  // all ranks, on a communicator of their own
  if (P > 1) {
    messenger.emplace(*world);
    if (sc.warm_up) start.emplace(*world, parallel::PipelineLayout::make(P, P));
  }
  CountingPart counted(*part, messenger ? &*messenger : nullptr, rank - 1, start ? &start->pipeline : nullptr,
                       sc.hold && rank > 0);
  RootState root;
  if (rank == 0) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(99);
    root = test::random_root(setup, tc, gen);
  }
  denoise(setup, counted, plan, rank, messenger ? &*messenger : nullptr, rank == 0 ? &root : nullptr);
  Outcome out;
  for (const GroupInputs& in : root.groups) out.latents.push_back(in.latents);
  out.blocks_per_call = counted.blocks_per_call;
  out.blocks_held = plan.blocks(rank).count();
  for (const WorkGroup& g : setup.groups)
    for (int64_t step = g.start_step; step < setup.steps; ++step)
      out.units += (setup.exact_step(g, step) ? 1 : setup.patches) * setup.passes;
  return out;
}

void expect_warm_up(const Scenario& sc, const std::string& what) {
  const parallel::MpiEnv& env = test::mpi_env();
  const int rank = env.rank(), P = env.size();
  Scenario off = sc;
  off.warm_up = false;
  off.hold = false;
  const Outcome with = run(sc, &env.world(), rank, P);
  const Outcome without = run(off, &env.world(), rank, P);
  const std::string where = str_cat(what, ", rank ", rank, " of ", P);
  // Rank 0 never warms up; a downstream rank runs its blocks once more, first.
  const int64_t extra = rank > 0 ? 1 : 0;
  ASSERT_EQ(static_cast<int64_t>(with.blocks_per_call.size()), with.units + extra) << where;
  ASSERT_EQ(static_cast<int64_t>(without.blocks_per_call.size()), without.units) << where;
  if (rank > 0) {
    const int64_t warm = with.blocks_per_call.front();
    if (sc.hold) EXPECT_EQ(warm, 1) << where << ": the first message had come, so the warm-up stops after a block";
    else EXPECT_TRUE(warm >= 1 && warm <= with.blocks_held) << where << ": " << warm << " block(s) warmed up";
  }
  for (size_t i = extra; i < with.blocks_per_call.size(); ++i)
    EXPECT_EQ(with.blocks_per_call[i], with.blocks_held) << where << ": call " << i << " ran every block";
  if (rank != 0) return;
  const Outcome alone = run(off, nullptr, 0, 1);
  ASSERT_EQ(with.latents.size(), alone.latents.size());
  for (size_t g = 0; g < with.latents.size(); ++g) {
    test::expect_identical(str_cat(where, ": group ", g, " final latents against no warm-up"), with.latents[g],
                           without.latents[g]);
    test::expect_identical(str_cat(where, ": group ", g, " final latents against one process"), with.latents[g],
                           alone.latents[g]);
  }
}

TEST(WarmUpWhileWaiting, ExactStepsSameBits) { expect_warm_up({1, 1, true, false}, "exact steps"); }

TEST(WarmUpWhileWaiting, PatchesAndTrueCfgSameBits) { expect_warm_up({2, 2, true, false}, "2 patches, true CFG"); }

TEST(WarmUpWhileWaiting, StopsAfterTheBlockDuringWhichTheMessageCame) {
  expect_warm_up({2, 1, true, true}, "2 patches, first message already there");
}

}  // namespace
}  // namespace fluxmpi::pipeline
