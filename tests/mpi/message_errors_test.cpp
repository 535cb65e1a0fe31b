// A receiver that gets another message than it expects reports sender, receiver, expected and
// actual header. Run in its own job: the rejected payloads stay unreceived until the job ends.

#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "parallel/message.h"
#include "mpi_test_main.h"

namespace fluxmpi::parallel {
namespace {

const MpiEnv& env() { return test::mpi_env(); }

// `sender` posts `sent` (small: sent eagerly, so the send completes without a receiver);
// `receiver` expects `expected` and returns the CommError it gets. Other ranks return "".
std::string mismatch(int sender, int receiver, const MessageTag& sent, at::Tensor payload, const MessageHeader& expected) {
  Messenger messenger(env());
  std::string error;
  if (env().rank() == sender) messenger.send(receiver, sent, {std::move(payload)});
  if (env().rank() == receiver) {
    try {
      messenger.recv(sender, expected, at::kCPU);
      error = "(no CommError)";
    } catch (const CommError& e) {
      error = e.what();
    }
  }
  messenger.wait_all();
  env().barrier();
  return error;
}

MessageHeader header(MessageKind kind, int64_t image, int64_t step, int32_t pass, at::ScalarType dtype,
                     std::vector<int64_t> shape) {
  MessageHeader h;
  h.tag = MessageTag{kind, image, step, pass};
  h.tensors = {TensorSpec{dtype, std::move(shape)}};
  return h;
}

TEST(MessageMismatch, WrongKind) {
  const std::string e = mismatch(0, 1, MessageTag{MessageKind::NoisePred, 3, 5, 0}, at::zeros({2, 3}),
                                 header(MessageKind::JointStream, 3, 5, 0, at::kFloat, {2, 3}));
  if (env().rank() == 1)
    EXPECT_EQ(e, "rank 1 expected JointStream(image 3, step 5, pass 0, fp32 [2, 3]) from rank 0, "
                 "got NoisePred(image 3, step 5, pass 0, fp32 [2, 3])");
}

TEST(MessageMismatch, WrongStepImageOrPass) {
  const int last = env().size() - 1;
  const std::string e = mismatch(last, 0, MessageTag{MessageKind::NoisePred, 1, 6, 1}, at::zeros({1, 4, 64}),
                                 header(MessageKind::NoisePred, 1, 5, 1, at::kFloat, {1, 4, 64}));
  if (env().rank() == 0)
    EXPECT_EQ(e, str_cat("rank 0 expected NoisePred(image 1, step 5, pass 1, fp32 [1, 4, 64]) from rank ", last,
                         ", got NoisePred(image 1, step 6, pass 1, fp32 [1, 4, 64])"));
  const std::string p = mismatch(0, last, MessageTag{MessageKind::JointStream, 2, 0, 1}, at::zeros({3}),
                                 header(MessageKind::JointStream, 2, 0, 0, at::kFloat, {3}));
  if (env().rank() == last) EXPECT_NE(p.find("got JointStream(image 2, step 0, pass 1"), std::string::npos) << p;
}

TEST(MessageMismatch, WrongDtypeOrShape) {
  const int last = env().size() - 1;
  const std::string d = mismatch(0, last, MessageTag{MessageKind::JointStream, 0, 0, 0}, at::zeros({1, 6, 8}, at::kHalf),
                                 header(MessageKind::JointStream, 0, 0, 0, at::kBFloat16, {1, 6, 8}));
  if (env().rank() == last)
    EXPECT_EQ(d, str_cat("rank ", last, " expected JointStream(image 0, step 0, pass 0, bf16 [1, 6, 8]) from rank 0, ",
                         "got JointStream(image 0, step 0, pass 0, fp16 [1, 6, 8])"));
  const std::string s = mismatch(0, last, MessageTag{MessageKind::JointStream, 0, 1, 0}, at::zeros({1, 7, 8}),
                                 header(MessageKind::JointStream, 0, 1, 0, at::kFloat, {1, 6, 8}));
  if (env().rank() == last) EXPECT_NE(s.find("expected JointStream(image 0, step 1, pass 0, fp32 [1, 6, 8])"), std::string::npos) << s;
  if (env().rank() == last) EXPECT_NE(s.find("got JointStream(image 0, step 1, pass 0, fp32 [1, 7, 8])"), std::string::npos) << s;
}

// recv_any_shape takes the sender's shapes but not another tag: a decoded tile of the wrong pass.
TEST(MessageMismatch, AnyShapeStillChecksTheTag) {
  const int last = env().size() - 1;
  Messenger messenger(env());
  std::string error;
  if (env().rank() == 0) messenger.send(last, MessageTag{MessageKind::DecodedTile, 1, 4, 0}, {at::zeros({1, 3, 4, 4})});
  if (env().rank() == last) {
    try {
      messenger.recv_any_shape(0, MessageTag{MessageKind::DecodedTile, 0, 4, 0}, at::kCPU);
      error = "(no CommError)";
    } catch (const CommError& e) {
      error = e.what();
    }
    EXPECT_EQ(error, str_cat("rank ", last, " expected DecodedTile(image 0, step 4, pass 0, fp32 [1, 3, 4, 4]) from rank 0, ",
                             "got DecodedTile(image 1, step 4, pass 0, fp32 [1, 3, 4, 4])"));
  }
  messenger.wait_all();
  env().barrier();
}

}  // namespace
}  // namespace fluxmpi::parallel
