// nn::attention's paths against a float64 softmax(q k^T · scale + bias) v, for the calls the
// models make: plain (FLUX, the VAE), with an additive position bias and no scaling (T5), causal
// (CLIP), bias and causal together, and a batch x heads count large enough to be chunked. The SDPA
// path exists with libtorch >= 2 only (Debian 13's 2.6; Debian 12's 1.13 has none), where it is
// the path attention() takes on other devices; on the CPU it takes the tiled path in fp32 and
// bf16 (tests/unit/attention_tiled_test.cpp tests that kernel's shapes); T5 always takes the math
// path.

#include <gtest/gtest.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <optional>

#include "models/common/attention.h"

namespace fluxmpi::nn {
namespace {

struct Call {
  const char* name;
  int64_t B, H, L, Dh;
  bool bias, causal;
  std::optional<double> scale;
};

const Call kCalls[] = {
    {"plain", 2, 4, 40, 16, false, false, std::nullopt},
    {"t5_bias_unscaled", 1, 4, 33, 8, true, false, 1.0},
    {"clip_causal", 2, 3, 17, 16, false, true, std::nullopt},
    {"bias_and_causal", 1, 2, 21, 8, true, true, 0.5},
};

at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                     const Call& c) {
  const double s = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.Dh)));
  at::Tensor scores = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-2, -1)) * s;
  if (bias.defined()) scores = scores + bias.to(at::kDouble);
  if (c.causal)
    scores = scores.masked_fill(at::ones({c.L, c.L}, at::kBool).triu(1), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v.to(at::kDouble));
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class AttentionPaths : public testing::TestWithParam<Call> {};

void check_path(AttentionPath path, const Call& c, at::ScalarType dtype, double tol) {
  at::manual_seed(7);
  auto opt = at::TensorOptions().dtype(dtype);
  at::Tensor q = at::randn({c.B, c.H, c.L, c.Dh}, opt), k = at::randn({c.B, c.H, c.L, c.Dh}, opt);
  at::Tensor v = at::randn({c.B, c.H, c.L, c.Dh}, opt);
  at::Tensor bias = c.bias ? at::randn({1, c.H, c.L, c.L}, opt) : at::Tensor();
  at::Tensor out = attention_via(path, q, k, v, bias, c.scale, c.causal);
  ASSERT_EQ(out.sizes(), q.sizes());
  EXPECT_EQ(out.scalar_type(), dtype);
  const double d = max_diff(out, reference(q, k, v, bias, c));
  EXPECT_LE(d, tol) << c.name << " (" << at::toString(dtype) << "): max |diff| " << d << " > " << tol;
}

// Tolerances against float64, per dtype: fp32 rounding over ~40 keys; bf16's 8-bit mantissa.
constexpr double kFp32Tol = 1e-5, kBf16Tol = 5e-2;

TEST_P(AttentionPaths, MathMatchesFloat64) {
  check_path(AttentionPath::Math, GetParam(), at::kFloat, kFp32Tol);
  check_path(AttentionPath::Math, GetParam(), at::kBFloat16, kBf16Tol);
}

TEST_P(AttentionPaths, SdpaMatchesFloat64) {
  if (!sdpa_available()) GTEST_SKIP() << "libtorch " << TORCH_VERSION << " has no scaled_dot_product_attention";
  check_path(AttentionPath::Sdpa, GetParam(), at::kFloat, kFp32Tol);
  check_path(AttentionPath::Sdpa, GetParam(), at::kBFloat16, kBf16Tol);
}

TEST_P(AttentionPaths, TiledMatchesFloat64) {
  check_path(AttentionPath::Tiled, GetParam(), at::kFloat, kFp32Tol);
  check_path(AttentionPath::Tiled, GetParam(), at::kBFloat16, kBf16Tol);
}

INSTANTIATE_TEST_SUITE_P(Calls, AttentionPaths, testing::ValuesIn(kCalls),
                         [](const testing::TestParamInfo<Call>& i) { return std::string(i.param.name); });

// Auto on the CPU: the tiled attention in fp32 and bf16 (faster than both other paths there,
// docs/performance.md), the math path in fp16; SDPA is what other devices take where it exists.
TEST(AttentionPath, AutoIsTiledOnTheCpuInFp32AndBf16) {
  EXPECT_EQ(sdpa_available(), TORCH_VERSION_MAJOR >= 2);
  at::manual_seed(3);
  at::Tensor q = at::randn({1, 2, 9, 8}), k = at::randn({1, 2, 9, 8}), v = at::randn({1, 2, 9, 8});
  at::Tensor bias = at::randn({1, 2, 9, 9});
  for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
    at::Tensor qt = q.to(t), kt = k.to(t), vt = v.to(t), bt = bias.to(t);
    EXPECT_EQ(default_attention_path(qt), AttentionPath::Tiled) << at::toString(t);
    EXPECT_TRUE(at::equal(attention(qt, kt, vt, bt, 1.0), attention_via(AttentionPath::Tiled, qt, kt, vt, bt, 1.0)));
  }
  EXPECT_EQ(default_attention_path(q.to(at::kHalf)), AttentionPath::Math);
  EXPECT_EQ(default_attention_path(q.to(at::kDouble)), AttentionPath::Math);
}

TEST(AttentionPath, TiledRefusesWhatItDoesNotCompute) {
  at::Tensor q = at::randn({1, 1, 4, 8});
  EXPECT_THROW(attention_via(AttentionPath::Tiled, q.to(at::kDouble), q.to(at::kDouble), q.to(at::kDouble)),
               std::exception);
}

TEST(AttentionPath, SdpaWithoutLibtorch2Throws) {
  if (sdpa_available()) GTEST_SKIP() << "libtorch " << TORCH_VERSION << " has scaled_dot_product_attention";
  at::Tensor q = at::randn({1, 1, 4, 8});
  EXPECT_THROW(attention_via(AttentionPath::Sdpa, q, q, q), std::exception);
}

// T5 takes the math path so that it rounds where transformers' eager T5Attention rounds, whose
// softmax is softmax(scores.float()).type_as(scores); the math path calls libtorch's bf16 softmax
// directly, which must therefore be that: fp32 inside, one rounding (bit for bit). The scores are
// T5-sized: unscaled, |s| up to ~40, 160 keys.
TEST(AttentionPath, Bf16SoftmaxIsFp32SoftmaxRoundedOnce) {
  at::manual_seed(11);
  at::Tensor scores = (at::randn({2, 4, 33, 160}) * 8).to(at::kBFloat16);
  at::Tensor ours = at::softmax(scores, -1);
  at::Tensor eager = at::softmax(scores.to(at::kFloat), -1).to(at::kBFloat16);
  ASSERT_EQ(ours.scalar_type(), at::kBFloat16);
  const int64_t differ = ours.ne(eager).sum().item<int64_t>();
  EXPECT_EQ(differ, 0) << "bf16 softmax: " << differ << " of " << ours.numel()
                       << " elements differ from softmax(scores.float()).to(bf16)";
}

// More batch x heads than fit one chunk of kAttentionChunkBytes: the math path splits them into
// chunks (16 heads of 16 MiB scores, then 4), whose result must still be the attention of every
// head. Checked against float64, not bit for bit against an unsplit call: BLAS may partition a
// batched matmul of 16 and of 20 heads differently over its threads.
TEST(AttentionPath, MathChunksMatchFloat64) {
  at::manual_seed(5);
  const Call c{"chunked", 1, 20, 2048, 8, false, false, std::nullopt};
  at::Tensor q = at::randn({1, 20, c.L, 8}), k = at::randn({1, 20, c.L, 8}), v = at::randn({1, 20, c.L, 8});
  const double d = max_diff(attention_via(AttentionPath::Math, q, k, v), reference(q, k, v, at::Tensor(), c));
  EXPECT_LE(d, kFp32Tol) << "chunked math attention: max |diff| " << d << " > " << kFp32Tol;
}

}  // namespace
}  // namespace fluxmpi::nn
