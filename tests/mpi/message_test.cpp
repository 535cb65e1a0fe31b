// Tensor messages between ranks under mpiexec (2 and 3 ranks): every dtype, multi-tensor
// messages, a pipeline of steps with bounded outstanding sends and reused receive buffers, a
// message large enough for MPI's rendezvous protocol, the time a receiver counts as blocked,
// and the sender-side checks.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "parallel/message.h"
#include "mpi_test_main.h"
#include "support/tensor_compare.h"

namespace fluxmpi::parallel {
namespace {

const MpiEnv& env() { return test::mpi_env(); }
int next_rank() { return (env().rank() + 1) % env().size(); }
int prev_rank() { return (env().rank() + env().size() - 1) % env().size(); }

// The values rank `sender` puts into tensor `index` of a message for (image, step).
at::Tensor payload(int sender, int index, int64_t image, int64_t step, at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const double offset = 1000.0 * sender + 100.0 * index + 10.0 * image + step;
  return at::arange(n, at::kFloat).mul(0.25).add(offset).reshape(shape).to(dtype).contiguous();
}

TEST(MessageRoundTrip, EveryDtypeAroundTheRing) {
  Messenger messenger(env());
  int64_t step = 0;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const std::vector<int64_t> shape = {2, 5, 64};
    const MessageTag tag{MessageKind::NoisePred, 7, step, 0};
    SendHandle h = messenger.send(next_rank(), tag, {payload(env().rank(), 0, 7, step, shape, dtype)});
    MessageHeader expected;
    expected.tag = tag;
    expected.tensors = {TensorSpec{dtype, shape}};
    std::vector<at::Tensor> got = messenger.recv(prev_rank(), expected, at::kCPU);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].scalar_type(), dtype);
    EXPECT_TRUE(got[0].is_contiguous());
    EXPECT_TRUE(test::identical(str_cat("ring payload ", c10::toString(dtype)), got[0],
                                payload(prev_rank(), 0, 7, step, shape, dtype)));
    messenger.wait(h);
    EXPECT_TRUE(messenger.test(h));
    ++step;
  }
  EXPECT_EQ(messenger.outstanding(), 0u);
  env().barrier();
}

TEST(MessageRoundTrip, MultiTensorMessages) {
  Messenger messenger(env());
  // DoubleStreams: txt, img, temb (temb in fp32 to show that dtypes may differ within a message).
  const MessageTag streams{MessageKind::DoubleStreams, 2, 3, 1};
  std::vector<std::vector<int64_t>> shapes = {{1, 7, 32}, {1, 16, 32}, {1, 32}};
  std::vector<at::ScalarType> dtypes = {at::kBFloat16, at::kBFloat16, at::kFloat};
  std::vector<at::Tensor> out;
  for (int i = 0; i < 3; ++i) out.push_back(payload(env().rank(), i, 2, 3, shapes[i], dtypes[i]));
  messenger.send(next_rank(), streams, std::move(out));  // the messenger keeps them alive

  MessageHeader expected;
  expected.tag = streams;
  for (int i = 0; i < 3; ++i) expected.tensors.push_back(TensorSpec{dtypes[i], shapes[i]});
  std::vector<at::Tensor> got = messenger.recv(prev_rank(), expected, at::kCPU);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(test::identical(str_cat("DoubleStreams tensor ", i), got[i], payload(prev_rank(), i, 2, 3, shapes[i], dtypes[i])));

  // JointStream: the joint stream and temb, fp16.
  const MessageTag joint{MessageKind::JointStream, 2, 4, 0};
  messenger.send(next_rank(), joint,
                 {payload(env().rank(), 0, 2, 4, {1, 23, 32}, at::kHalf), payload(env().rank(), 1, 2, 4, {1, 32}, at::kHalf)});
  std::vector<at::Tensor> buffers = {at::empty({1, 23, 32}, at::kHalf), at::empty({1, 32}, at::kHalf)};
  messenger.recv_into(prev_rank(), joint, buffers);
  EXPECT_TRUE(test::identical("JointStream hidden", buffers[0], payload(prev_rank(), 0, 2, 4, {1, 23, 32}, at::kHalf)));
  EXPECT_TRUE(test::identical("JointStream temb", buffers[1], payload(prev_rank(), 1, 2, 4, {1, 32}, at::kHalf)));
  messenger.wait_all();
  env().barrier();
}

// A receiver that cannot know the sizes (a decode helper learning each pass's batch) takes the
// sender's shapes and dtypes, and an empty batch travels too (message_errors_test: the tag is
// still checked).
TEST(MessageRoundTrip, ShapesChosenByTheSender) {
  Messenger messenger(env());
  const std::vector<std::vector<int64_t>> shapes = {{2, 4, 7, 10}, {0, 4, 7, 10}};
  for (int64_t pass = 0; pass < 2; ++pass) {
    const MessageTag tag{MessageKind::DecodeLatents, pass, 0, 0};
    messenger.send(next_rank(), tag, {payload(env().rank(), 0, pass, 0, shapes[pass], at::kBFloat16)});
    std::vector<at::Tensor> got = messenger.recv_any_shape(prev_rank(), tag, at::kCPU);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].scalar_type(), at::kBFloat16);
    EXPECT_EQ(got[0].sizes().vec(), shapes[pass]);
    EXPECT_TRUE(test::identical(str_cat("DecodeLatents of pass ", pass), got[0],
                                payload(prev_rank(), 0, pass, 0, shapes[pass], at::kBFloat16)));
  }
  messenger.wait_all();
  env().barrier();
}

// The protocol of one denoising step (DESIGN.md §3): rank 0 -> ... -> last rank -> rank 0, for
// several images and steps; each rank adds its own contribution, receive buffers are reused, and
// at most two sends are in flight per rank.
TEST(MessagePipeline, StepsFlowThroughTheRanks) {
  const int P = env().size(), r = env().rank();
  if (P < 2) GTEST_SKIP() << "needs 2 or more ranks";
  Messenger messenger(env(), /*max_outstanding=*/2);
  const int64_t L_txt = 4, L_img = 6, D = 8;
  std::vector<at::Tensor> streams = {at::empty({1, L_txt, D}), at::empty({1, L_img, D}), at::empty({1, D})};
  std::vector<at::Tensor> noise = {at::empty({1, L_img, D})};
  for (int64_t image = 0; image < 3; ++image) {
    for (int64_t step = 0; step < 4; ++step) {
      const MessageTag in_tag{MessageKind::DoubleStreams, image, step, 0};
      const MessageTag v_tag{MessageKind::NoisePred, image, step, 0};
      if (r == 0) {
        const double x = 100.0 * image + step;
        messenger.send(1, in_tag, {at::full({1, L_txt, D}, x), at::full({1, L_img, D}, x + 0.5), at::full({1, D}, -x)});
        EXPECT_LE(messenger.outstanding(), 2u);
        messenger.recv_into(P - 1, v_tag, noise);
        // Ranks 1..P-1 each added their rank to the image stream: x + 0.5 + (P - 1) P / 2.
        EXPECT_TRUE(test::identical(str_cat("noise_pred image ", image, " step ", step), noise[0],
                                    at::full({1, L_img, D}, x + 0.5 + (P - 1) * P / 2.0)));
        continue;
      }
      messenger.recv_into(r - 1, in_tag, streams);
      std::vector<at::Tensor> out = {streams[0] + r, streams[1] + r, streams[2].clone()};
      if (r < P - 1) messenger.send(r + 1, in_tag, std::move(out));
      else messenger.send(0, v_tag, {out[1]});
      EXPECT_LE(messenger.outstanding(), 2u);
    }
  }
  messenger.wait_all();
  EXPECT_EQ(messenger.outstanding(), 0u);
  env().barrier();
}

// 64 MiB is far above every eager limit: the payload goes by rendezvous while the sender holds no
// reference of its own.
TEST(MessageRoundTrip, LargeMessage) {
  const int P = env().size(), r = env().rank();
  if (P < 2) GTEST_SKIP() << "needs 2 or more ranks";
  Messenger messenger(env());
  const MessageTag tag{MessageKind::JointStream, 0, 0, 0};
  const std::vector<int64_t> shape = {1, 4096, 4096};
  if (r == 0) {
    SendHandle h = messenger.send(P - 1, tag, {payload(0, 0, 0, 0, shape, at::kFloat)});
    messenger.wait(h);
  } else if (r == P - 1) {
    MessageHeader expected;
    expected.tag = tag;
    expected.tensors = {TensorSpec{at::kFloat, shape}};
    std::vector<at::Tensor> got = messenger.recv(0, expected, at::kCPU);
    EXPECT_TRUE(test::identical("64 MiB payload", got[0], payload(0, 0, 0, 0, shape, at::kFloat)));
  }
  env().barrier();
}

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The time a receive blocks is counted: never more than the receive took, and at least the time
// from the moment the receiver entered recv() until the sender sent. Both ends read the same
// monotonic clock (the ranks share one machine), so the bounds hold however fast the machine is;
// only the lower bound needs the receiver not to be descheduled between entering recv() and
// starting the count, so it must hold in one of five tries (a receive that counts nothing fails
// all five), the upper bound in every try.
TEST(MessageTiming, AReceiverCountsTheTimeItWaits) {
  const int P = env().size(), r = env().rank();
  if (P < 2) GTEST_SKIP() << "needs 2 or more ranks";
  Messenger messenger(env());
  EXPECT_EQ(messenger.blocked_seconds(), 0.0);
  const std::vector<int64_t> shape = {4};
  bool lower_bound_held = false;
  std::string tries;
  for (int attempt = 0; attempt < 5 && !lower_bound_held; ++attempt) {
    const MessageTag tag{MessageKind::NoisePred, 0, attempt, 0};
    env().barrier();
    int64_t sent_ns = 0, entered_ns = 0, left_ns = 0;
    const double before = messenger.blocked_seconds();
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // so that rank 1 usually waits
      sent_ns = monotonic_ns();
      messenger.wait(messenger.send(1, tag, {payload(0, 0, 0, 0, shape, at::kFloat)}));
    } else if (r == 1) {
      std::vector<at::Tensor> buffers = {at::empty(shape, at::kFloat)};
      entered_ns = monotonic_ns();
      messenger.recv_into(0, tag, buffers);
      left_ns = monotonic_ns();
    }
    sent_ns = env().broadcast_int64s({sent_ns})[0];
    if (r == 1) {
      const double blocked = messenger.blocked_seconds() - before;
      const double took = (left_ns - entered_ns) * 1e-9, lower = (sent_ns - entered_ns) * 1e-9;
      EXPECT_LE(blocked, took + 1e-6) << "try " << attempt;
      tries += str_cat(" [blocked ", blocked, " s, sent ", lower, " s after entering recv]");
      lower_bound_held = lower > 0.05 && blocked >= lower;
    }
    lower_bound_held = env().agree(lower_bound_held ? 1 : 0) == 1;  // the largest over the ranks: rank 1 decides
  }
  if (r == 1) EXPECT_TRUE(lower_bound_held) << "the receive did not count its wait:" << tries;
  env().barrier();
}

TEST(MessageSend, HandlesAndSenderChecks) {
  Messenger messenger(env());
  EXPECT_THROW(messenger.test(SendHandle{}), InternalError);
  EXPECT_THROW(messenger.wait(SendHandle{12345}), InternalError);
  const MessageTag tag{MessageKind::NoisePred, 0, 0, 0};
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_THROW(messenger.send(next_rank(), tag, {strided}), InternalError);
  EXPECT_THROW(messenger.send(next_rank(), tag, {at::zeros({4}, at::kLong)}), InternalError);
  EXPECT_THROW(messenger.send(env().size(), tag, {at::zeros({4})}), InternalError);
  EXPECT_THROW(messenger.send(next_rank(), tag, {}), InternalError);
  std::vector<at::Tensor> buffers = {strided};
  EXPECT_THROW(messenger.recv_into(prev_rank(), tag, buffers), InternalError);
  EXPECT_EQ(messenger.outstanding(), 0u) << "a rejected send must post nothing";
  EXPECT_FALSE(messenger.cuda_aware() && !at::hasCUDA()) << "CUDA-aware MPI but a CPU-only libtorch";
  env().barrier();
}

}  // namespace
}  // namespace fluxmpi::parallel
