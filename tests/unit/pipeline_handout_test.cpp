// A pipeline leader's hand-out (`--stages`, pipeline/denoise.h): at most `slots` work groups in
// flight, visited round robin, a finished group's slot refilled at once from the source (the
// hand-computed order of a 5-group, 3-step, 2-slot run); without a source every group is in flight
// and the order is step-major, as before --stages; and whatever order the groups are handed out
// in, every image's every step is bit-identical (exact steps, micro-batches, patch pipelining).

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <deque>
#include <set>

#include "core/error.h"
#include "models/common/init.h"
#include "models/flux/transformer.h"
#include "parallel/partition.h"
#include "pipeline/denoise.h"
#include "sched/flow_match_euler.h"
#include "support/step_loop.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

// Hands out a fixed list of groups.
class ListSource : public WorkSource {
 public:
  explicit ListSource(std::vector<size_t> order) : order_(order.begin(), order.end()) {}
  std::optional<size_t> next() override {
    if (order_.empty()) return std::nullopt;
    const size_t g = order_.front();
    order_.pop_front();
    ++handed;
    return g;
  }
  int handed = 0;

 private:
  std::deque<size_t> order_;
};

// Records the order of (first image, step) and how many groups were started but not finished.
class OrderRecorder : public test::StepRecorder {
 public:
  void on_step(const WorkGroup& g, int64_t step, const at::Tensor& latents, const at::Tensor& v) override {
    test::StepRecorder::on_step(g, step, latents, v);
    order.push_back({g.first_image, step});
    started.insert(g.first_image);
    max_in_flight = std::max(max_in_flight, started.size() - finished.size());
  }
  std::vector<std::pair<int64_t, int64_t>> order;
  std::set<int64_t> started, finished;
  size_t max_in_flight = 0;
};

class HandOut : public test::TinyLoopTest {
 protected:
  void SetUp() override {
    make_loop(3, 6, 4, 6);
  }
  // `groups` groups of `m` images each, with inputs drawn from one generator (the same every call).
  RootState root_for(int64_t groups, int64_t m) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
    setup_.groups.clear();
    RootState root;
    root.schedule = schedule_;
    root.guidance = 3.5;
    for (int64_t g = 0; g < groups; ++g) {
      setup_.groups.push_back({g * m, m, 0});
      GroupInputs in;
      in.latents = at::randn({m, setup_.image_tokens(), 64}, gen);
      in.text = at::randn({m, 6, 24}, gen);
      in.pooled = at::randn({m, 20}, gen);
      root.groups.push_back(in);
    }
    return root;
  }
  // Runs the loop; the groups finished, in order.
  std::vector<size_t> run(RootState& root, OrderRecorder& rec) {
    std::vector<size_t> done;
    root.observer = &rec;
    root.on_group_done = [&](size_t gi) {
      done.push_back(gi);
      rec.finished.insert(setup_.groups[gi].first_image);
    };
    c10::InferenceMode guard;
    denoise(setup_, *model_, *plan_, 0, nullptr, &root);
    return done;
  }

};

TEST_F(HandOut, SlotsBoundTheGroupsInFlightVisitedRoundRobin) {
  RootState root = root_for(5, 1);
  ListSource source({0, 1, 2, 3, 4});
  root.source = &source;
  root.slots = 2;
  OrderRecorder rec;
  const std::vector<size_t> done = run(root, rec);
  // By hand: groups 0 and 1 take turns step by step; when 0's last step is back it is finished and
  // 2 takes its slot, then 1 finishes and 3 comes; 2 and 3 take turns; 4 runs alone at the end.
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}, {2, 0}, {3, 0},
                                                             {2, 1}, {3, 1}, {2, 2}, {3, 2}, {4, 0}, {4, 1}, {4, 2}};
  EXPECT_EQ(rec.order, expected);
  EXPECT_EQ(done, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(rec.max_in_flight, 2u);
  EXPECT_EQ(source.handed, 5) << "the source is asked until it is empty";
}

TEST_F(HandOut, WithoutASourceEveryGroupIsInFlightStepMajor) {
  RootState root = root_for(3, 1);
  OrderRecorder rec;
  const std::vector<size_t> done = run(root, rec);
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1},
                                                             {2, 1}, {0, 2}, {1, 2}, {2, 2}};
  EXPECT_EQ(rec.order, expected);
  EXPECT_EQ(done, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(rec.max_in_flight, 3u);
}

// The same images whatever the hand-out: every step's latents and noise prediction bit-identical.
void expect_same_images(const OrderRecorder& got, const OrderRecorder& ref, const std::string& what) {
  ASSERT_EQ(got.x.size(), ref.x.size()) << what;
  for (const auto& [key, x] : ref.x) {
    const std::string name = str_cat(what, ": image ", key.first, " step ", key.second);
    EXPECT_TRUE(test::identical(name + " latents", got.x.at(key), x));
    EXPECT_TRUE(test::identical(name + " noise_pred", got.vs.at(key), ref.vs.at(key)));
  }
}

TEST_F(HandOut, AnyHandOutOrderGivesTheSameBits) {
  for (int64_t patches : {1, 2}) {
    setup_.patches = patches;
    setup_.warmup_steps = 1;
    for (int64_t m : {1, 2}) {
      RootState ref_root = root_for(5, m);
      OrderRecorder ref;
      run(ref_root, ref);
      for (size_t slots : {1, 2, 3}) {
        RootState root = root_for(5, m);
        ListSource source({3, 0, 4, 1, 2});
        root.source = &source;
        root.slots = slots;
        OrderRecorder rec;
        const std::vector<size_t> done = run(root, rec);
        EXPECT_EQ(done.size(), 5u);
        EXPECT_LE(rec.max_in_flight, slots);
        expect_same_images(rec, ref, str_cat("patches ", patches, ", microbatch ", m, ", slots ", slots));
      }
    }
  }
}

}  // namespace
}  // namespace fluxmpi::pipeline
