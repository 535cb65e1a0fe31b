// The fixed message header: wire round trip, descriptions, and what the receiver rejects. The
// exchange itself runs under mpiexec in tests/mpi/message_test.cpp.

#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "parallel/message.h"

namespace fluxmpi::parallel {
namespace {

MessageHeader joint_header() {
  MessageHeader h;
  h.tag = MessageTag{MessageKind::JointStream, 3, 5, 0};
  h.tensors = {TensorSpec{at::kBFloat16, {1, 4608, 3072}}, TensorSpec{at::kBFloat16, {1, 3072}}};
  return h;
}

std::string comm_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  return "(no CommError)";
}

TEST(MessageHeader, RoundTripsThroughTheWireForm) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kByte}) {
    MessageHeader h;
    h.tag = MessageTag{MessageKind::DoubleStreams, 12345678901LL, 27, 1};
    h.tensors = {TensorSpec{dtype, {2, 512, 3072}}, TensorSpec{dtype, {2, 4096, 3072}}, TensorSpec{at::kFloat, {2, 3072}},
                 TensorSpec{dtype, {}}, TensorSpec{dtype, {1, 2, 3, 4, 5, 6}}};
    const MessageHeader back = decode_header(encode_header(h), 0, 1);
    EXPECT_EQ(back, h) << back.describe() << " vs " << h.describe();
    h.tag.patch = 7;  // a patch of a pipelined step
    const MessageHeader patched = decode_header(encode_header(h), 0, 1);
    EXPECT_EQ(patched, h) << patched.describe() << " vs " << h.describe();
    EXPECT_EQ(patched.tag.patch, 7);
  }
}

TEST(MessageHeader, Describes) {
  EXPECT_EQ(joint_header().describe(), "JointStream(image 3, step 5, pass 0, bf16 [1, 4608, 3072], bf16 [1, 3072])");
  MessageHeader v;
  v.tag = MessageTag{MessageKind::NoisePred, 0, 27, 1};
  v.tensors = {TensorSpec{at::kFloat, {1, 4096, 64}}};
  EXPECT_EQ(v.describe(), "NoisePred(image 0, step 27, pass 1, fp32 [1, 4096, 64])");
  EXPECT_EQ(TensorSpec({at::kBFloat16, {1, 4608, 3072}}).nbytes(), 1 * 4608 * 3072 * 2);
  v.tag.patch = 3;
  v.tensors = {TensorSpec{at::kFloat, {1, 1024, 64}}};
  EXPECT_EQ(v.describe(), "NoisePred(image 0, step 27, pass 1, patch 3, fp32 [1, 1024, 64])");
  // ControlNet residuals: the samples a rank's blocks add, stacked.
  MessageHeader r;
  r.tag = MessageTag{MessageKind::ControlResiduals, 2, 4, 0, 1};
  r.tensors = {TensorSpec{at::kBFloat16, {3, 1, 1024, 3072}}};
  EXPECT_EQ(r.describe(), "ControlResiduals(image 2, step 4, pass 0, patch 1, bf16 [3, 1, 1024, 3072])");
  EXPECT_EQ(decode_header(encode_header(r), 0, 2), r);
}

TEST(MessageHeader, MismatchNamesBothSidesAndBothHeaders) {
  MessageHeader got = joint_header();
  got.tag.kind = MessageKind::NoisePred;
  EXPECT_EQ(comm_error([&] { check_header(joint_header(), got, 0, 1); }),
            "rank 1 expected JointStream(image 3, step 5, pass 0, bf16 [1, 4608, 3072], bf16 [1, 3072]) from rank 0, "
            "got NoisePred(image 3, step 5, pass 0, bf16 [1, 4608, 3072], bf16 [1, 3072])");
  check_header(joint_header(), joint_header(), 0, 1);  // equal: no error

  // Every field takes part in the comparison.
  std::vector<std::function<void(MessageHeader&)>> changes = {
      [](MessageHeader& h) { h.tag.image = 4; },
      [](MessageHeader& h) { h.tag.step = 6; },
      [](MessageHeader& h) { h.tag.pass = 1; },
      [](MessageHeader& h) { h.tag.patch = 0; },
      [](MessageHeader& h) { h.tensors[0].dtype = at::kHalf; },
      [](MessageHeader& h) { h.tensors[0].shape[1] = 4607; },
      [](MessageHeader& h) { h.tensors[1].shape.push_back(1); },
      [](MessageHeader& h) { h.tensors.pop_back(); },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    MessageHeader changed = joint_header();
    changes[i](changed);
    EXPECT_NE(comm_error([&] { check_header(joint_header(), changed, 2, 3); }).find("rank 3 expected JointStream"),
              std::string::npos)
        << "change " << i;
  }
}

TEST(MessageHeader, MalformedWireFormIsACommError) {
  const HeaderWords good = encode_header(joint_header());
  auto bad = [&](int index, int64_t value) {
    HeaderWords w = good;
    w[index] = value;
    return comm_error([&] { decode_header(w, 0, 1); });
  };
  EXPECT_NE(bad(0, 42).find("rank 1 received a malformed message header from rank 0: bad magic number"), std::string::npos);
  EXPECT_NE(bad(1, 1).find("protocol version 1, this build speaks 2"), std::string::npos);
  EXPECT_NE(bad(2, 13).find("unknown message kind 13"), std::string::npos);
  EXPECT_NE(bad(5, 2).find("pass 2"), std::string::npos);
  EXPECT_NE(bad(6, 0).find("0 tensors"), std::string::npos);
  EXPECT_NE(bad(6, kMaxMessageTensors + 1).find("tensors (1 to"), std::string::npos);
  EXPECT_NE(bad(7, 7).find("tensor 0 has unknown dtype code 7"), std::string::npos);
  EXPECT_NE(bad(8, kMaxTensorDims + 1).find("tensor 0 has 7 dimensions"), std::string::npos);
  EXPECT_NE(bad(9, -1).find("negative size -1"), std::string::npos);
  EXPECT_NE(bad(kHeaderPatchWord, -2).find("patch -2 (must be -1 or a patch index)"), std::string::npos);
}

TEST(MessageHeader, SenderSideLimitsAreInternalErrors) {
  MessageHeader h = joint_header();
  h.tensors[0].dtype = at::kLong;
  EXPECT_THROW(encode_header(h), InternalError);
  h = joint_header();
  h.tensors[0].shape = {1, 1, 1, 1, 1, 1, 1};
  EXPECT_THROW(encode_header(h), InternalError);
  h = joint_header();
  h.tensors.assign(kMaxMessageTensors + 1, TensorSpec{at::kFloat, {1}});
  EXPECT_THROW(encode_header(h), InternalError);
  h.tensors.clear();
  EXPECT_THROW(encode_header(h), InternalError);
}

TEST(MessageHeader, OfTakesDtypesAndShapesFromTensors) {
  std::vector<at::Tensor> ts = {at::zeros({2, 3}, at::kHalf), at::zeros({4}, at::kFloat)};
  const MessageHeader h = MessageHeader::of(MessageTag{MessageKind::NoisePred, 1, 2, 0}, ts);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].dtype, at::kHalf);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.tensors[1].shape, (std::vector<int64_t>{4}));
}

}  // namespace
}  // namespace fluxmpi::parallel
