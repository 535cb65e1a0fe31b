// The pieces of `--stages` under mpiexec (2, 3 and 4 ranks): the pipelines' and the leaders'
// communicators for every S that divides P, the shared work counter (every index handed out
// exactly once, whoever asks), the tensor broadcast from rank 0 to the leaders, messages inside a
// pipeline naming world ranks in their errors, and the leaders' synchronous, bounded sends to rank
// 0 taken with poll_any.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "core/error.h"
#include "mpi_test_main.h"
#include "parallel/message.h"
#include "parallel/pipelines.h"
#include "parallel/tensor_broadcast.h"
#include "parallel/work_counter.h"
#include "support/tensor_compare.h"

namespace fluxmpi::parallel {
namespace {

const MpiEnv& env() { return test::mpi_env(); }

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int s = 1; s <= n; ++s)
    if (n % s == 0) d.push_back(s);
  return d;
}

TEST(PipelineComms, EveryStageCountThatDividesTheJob) {
  const int P = env().size(), rank = env().rank();
  for (int S : divisors(P)) {
    const PipelineLayout layout = PipelineLayout::make(P, S);
    PipelineComms comms(env().world(), layout);
    EXPECT_EQ(comms.pipeline.size(), S) << "S = " << S;
    EXPECT_EQ(comms.pipeline.rank(), rank % S) << "S = " << S;
    for (int r = 0; r < S; ++r) EXPECT_EQ(comms.pipeline.world_rank(r), rank / S * S + r) << "S = " << S;
    if (rank % S == 0) {
      EXPECT_EQ(comms.leaders.size(), P / S) << "S = " << S;
      EXPECT_EQ(comms.leaders.rank(), rank / S) << "S = " << S;
      for (int k = 0; k < P / S; ++k) EXPECT_EQ(comms.leaders.world_rank(k), k * S) << "S = " << S;
    } else {
      EXPECT_TRUE(comms.leaders.empty()) << "S = " << S;
    }
    comms.pipeline.quiet_barrier();
  }
  env().barrier();
}

TEST(WorkCounter, EveryIndexExactlyOnceWhoeverAsks) {
  const Communicator& world = env().world();
  constexpr int64_t kLimit = 57;
  WorkCounter counter(world, kLimit);
  std::vector<int64_t> mine;
  while (std::optional<int64_t> i = counter.take()) {
    mine.push_back(*i);
    if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a slow taker takes fewer
  }
  EXPECT_FALSE(counter.take().has_value()) << "the counter stays exhausted";
  EXPECT_EQ(counter.taken(), static_cast<int64_t>(mine.size()));
  std::vector<uint8_t> bytes(mine.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  std::multiset<int64_t> all;
  for (const auto& b : world.all_gather_bytes(bytes)) {
    std::vector<int64_t> v(b.size() / sizeof(int64_t));
    std::memcpy(v.data(), b.data(), b.size());
    for (size_t k = 1; k < v.size(); ++k) EXPECT_LT(v[k - 1], v[k]) << "one rank's indices come in increasing order";
    all.insert(v.begin(), v.end());
  }
  ASSERT_EQ(all.size(), static_cast<size_t>(kLimit));
  int64_t expect = 0;
  for (int64_t i : all) EXPECT_EQ(i, expect++) << "every index once";
  counter.close();
}

TEST(BroadcastTensors, RankZerosTensorsOnEveryRank) {
  auto reference = [] {
    return std::vector<at::Tensor>{at::arange(6, at::kFloat).reshape({2, 3}).mul(0.5), at::Tensor(),
                                   at::tensor(std::vector<int64_t>{4, -3, 2, 1}), at::empty({0, 5}, at::kBFloat16),
                                   at::arange(3, at::kFloat).to(at::kByte), at::arange(4, at::kFloat).to(at::kBFloat16)};
  };
  std::vector<at::Tensor> t = env().rank() == 0 ? reference() : std::vector<at::Tensor>{at::ones({9})};
  broadcast_tensors(env().world(), t, 0);
  const std::vector<at::Tensor> ref = reference();
  ASSERT_EQ(t.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(t[i].defined(), ref[i].defined()) << "tensor " << i;
    if (ref[i].defined()) EXPECT_TRUE(test::identical(str_cat("broadcast tensor ", i), t[i], ref[i]));
  }
}

TEST(PipelineMessages, ErrorsNameWorldRanks) {
  const int P = env().size();
  if (P % 2 != 0) GTEST_SKIP() << "pipelines of 2 need an even number of ranks";
  PipelineComms comms(env().world(), PipelineLayout::make(P, 2));
  Messenger messenger(comms.pipeline);
  const int leader = env().rank() / 2 * 2;
  if (comms.pipeline.rank() == 0) {
    messenger.send(1, MessageTag{MessageKind::NoisePred, 3, 5, 0}, {at::zeros({1, 4})});
    messenger.wait_all();
  } else {
    std::vector<at::Tensor> buffers = {at::empty({1, 4})};
    try {
      messenger.recv_into(0, MessageTag{MessageKind::NoisePred, 3, 4, 0}, buffers);
      ADD_FAILURE() << "a header with the wrong step was accepted";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(str_cat("rank ", leader + 1, " expected NoisePred(image 3, step 4")), std::string::npos) << what;
      EXPECT_NE(what.find(str_cat("from rank ", leader, ", got NoisePred(image 3, step 5")), std::string::npos) << what;
    }
    // The payload is still on its way: take it so that the job ends clean.
    messenger.recv_payload(0, MessageHeader::of(MessageTag{MessageKind::NoisePred, 3, 5, 0}, buffers), buffers);
  }
  comms.pipeline.quiet_barrier();
}

TEST(LeaderMessages, SynchronousBoundedSendsTakenByPollAny) {
  const Communicator& world = env().world();
  constexpr int kMessages = 25;
  constexpr size_t kInFlight = 2;
  if (world.rank() != 0) {
    Messenger messenger(world, kInFlight, SendMode::Synchronous);
    for (int k = 0; k < kMessages; ++k) {
      messenger.send(0, MessageTag{MessageKind::StepRow, world.rank(), k, 0}, {at::full({3}, 10.0 * world.rank() + k)});
      // Synchronous sends complete only once rank 0 took them: never more than kInFlight pending.
      EXPECT_LE(messenger.outstanding(), kInFlight);
    }
    messenger.send(0, MessageTag{MessageKind::LeaderDone, -1, -1, 0}, {at::empty({0})});
    messenger.wait_all();
  } else {
    Messenger messenger(world);
    std::vector<int> next(static_cast<size_t>(world.size()), 0);
    int done = 0;
    while (done < world.size() - 1) {
      std::optional<Incoming> in = messenger.poll_any();
      if (!in) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow writer: the senders wait
        continue;
      }
      std::vector<at::Tensor> buffers;
      for (const TensorSpec& t : in->header.tensors) buffers.push_back(at::empty(t.shape, at::TensorOptions().dtype(t.dtype)));
      messenger.recv_payload(in->source, in->header, buffers);
      if (in->header.tag.kind == MessageKind::LeaderDone) {
        EXPECT_EQ(next[static_cast<size_t>(in->source)], kMessages) << "LeaderDone after every row of rank " << in->source;
        ++done;
        continue;
      }
      const int k = next[static_cast<size_t>(in->source)]++;
      EXPECT_EQ(in->header.tag.image, in->source);
      EXPECT_EQ(in->header.tag.step, k) << "one sender's messages keep their order";
      EXPECT_TRUE(test::identical(str_cat("row ", k, " of rank ", in->source), buffers[0], at::full({3}, 10.0 * in->source + k)));
    }
  }
  world.quiet_barrier();
}

}  // namespace
}  // namespace fluxmpi::parallel
