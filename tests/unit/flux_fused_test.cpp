// The fused CPU kernels of the FLUX blocks (models/flux/fused.h) against the operator-by-operator
// formulation they replace (RMSNormImpl + apply_rope, nn::attention), and whole blocks in fp32 and
// bf16 against the same blocks run in fp64, where every step takes the operator path.

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "models/common/attention.h"
#include "models/common/init.h"
#include "models/common/tensor_utils.h"
#include "models/flux/double_block.h"
#include "models/flux/fused.h"
#include "models/flux/latents.h"
#include "models/flux/single_block.h"
#include "support/tensor_compare.h"

namespace fluxmpi::flux {
namespace {

// One bf16 rounding of the output scale: the fused kernels round at the same steps as the
// operators; only RMSNorm's sum of squares is added in another order, which can move a value
// across a rounding boundary.
constexpr double kOneBf16Ulp = 3.90625e-3;

// One bf16 ulp at each value's magnitude (8 significant bits).
at::Tensor bf16_ulp(const at::Tensor& v) { return at::exp2(at::floor(at::log2(v.abs().clamp_min(1e-30))) - 7); }

// Text tokens, then the (latent_h / 2) x (latent_w / 2) image tokens.
RopeTables tables(int64_t S, int64_t latent_h, int64_t latent_w, const std::vector<int64_t>& axes) {
  return rope_tables(at::cat({text_position_ids(S), image_position_ids(latent_h, latent_w)}, 0), axes);
}

TEST(FluxFused, RmsNormRopeMatchesTheOperators) {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t B = 2, S = 5, H = 3, Dh = 16, L = 12;
  const RopeTables rope = tables(S, 6, 8, {4, 6, 6});
  ASSERT_EQ(rope.cos.size(0), S + L);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    nn::RMSNorm norm(Dh, 1e-6);
    norm->weight = (1 + 0.1 * at::randn({Dh}, gen)).to(dtype);
    // Slices of a fused projection [B, N, 3 * H * Dh], as the blocks pass them.
    at::Tensor txt = (3 * at::randn({B, S, 3 * H * Dh}, gen)).to(dtype);
    at::Tensor img = (3 * at::randn({B, L, 3 * H * Dh}, gen)).to(dtype);
    at::Tensor tq = txt.narrow(-1, H * Dh, H * Dh).view({B, S, H, Dh});
    at::Tensor iq = img.narrow(-1, H * Dh, H * Dh).view({B, L, H, Dh});
    at::Tensor out = at::empty({B, H, S + L, Dh}, txt.options());
    fused::rms_norm_rope_into(tq, norm->weight, norm->eps, rope, 0, out);
    fused::rms_norm_rope_into(iq, norm->weight, norm->eps, rope, S, out);
    at::Tensor ref = apply_rope(at::cat({norm->forward(tq), norm->forward(iq)}, 1), rope).transpose(1, 2);
    ASSERT_EQ(out.scalar_type(), dtype);
    const double tol = dtype == at::kFloat ? 1e-6 : kOneBf16Ulp;
    EXPECT_TRUE(test::close_to(std::string("rms_norm_rope_into ") + nn::dtype_label(dtype), out, ref, tol));
  }
}

TEST(FluxFused, AttentionIntoMatchesNnAttention) {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const int64_t B = 2, H = 3, N = 37, Dh = 16;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor q = at::randn({B, H, N, Dh}, gen).to(dtype), k = at::randn({B, H, N, Dh}, gen).to(dtype);
    at::Tensor vt = at::randn({B, H, Dh, N}, gen).to(dtype);
    // A column slice of a wider buffer, as the single block passes it.
    at::Tensor buffer = at::full({B, N, H * Dh + 5}, 7.0, q.options());
    at::Tensor out = buffer.narrow(-1, 0, H * Dh);
    fused::attention_into(q, k, vt.transpose(2, 3), out);
    at::Tensor ref = nn::attention(q, k, vt.transpose(2, 3)).transpose(1, 2).reshape({B, N, H * Dh});
    const double tol = dtype == at::kFloat ? 1e-6 : 2 * kOneBf16Ulp;
    EXPECT_TRUE(test::close_to(std::string("attention_into ") + nn::dtype_label(dtype), out, ref, tol));
    EXPECT_TRUE(test::identical("columns after the slice", buffer.narrow(-1, H * Dh, 5), at::full({B, N, 5}, 7.0, q.options())));
  }
}

TEST(FluxFused, SoftmaxScaledMatchesLibtorchsBf16Softmax) {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const double scale = 0.125;
  // Rows shorter and longer than the kernel's 8 partial sums, and a row whose values are so far
  // below its maximum that their exponentials underflow.
  for (int64_t N : {3, 37, 1000}) {
    at::Tensor x = (8 * at::randn({2, 5, N}, gen)).to(at::kBFloat16);
    x[1][2].fill_(-30000);
    x[1][2][0] = 40;
    at::Tensor ref = at::softmax(x * scale, -1);  // libtorch's bf16 operators, as before this kernel
    at::Tensor got = x.clone();
    fused::softmax_scaled_(got, scale);
    // Probabilities are at most 1: one bf16 rounding of the result is one ulp of 1 at most.
    EXPECT_TRUE(test::close_to("softmax_scaled_ N=" + std::to_string(N), got, ref, kOneBf16Ulp));
    EXPECT_TRUE(test::identical("the underflowing row", got[1][2].narrow(0, 1, N - 1), at::zeros({N - 1}, got.options())));
    EXPECT_EQ(got[1][2][0].item<float>(), 1.0f);
  }
}

TEST(FluxFused, GeluTanhIntoIsWithinOneRoundingOfFp64) {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  // Values from deep in the negative tail (where 1 + tanh cancels) to large positive ones.
  at::Tensor x = at::cat({4 * at::randn({2, 9, 70}, gen), at::linspace(-12, 12, 2 * 9 * 30).view({2, 9, 30})}, 2)
                     .to(at::kBFloat16);
  // Into a column slice of a wider buffer, as the single block writes proj_out's input.
  at::Tensor buffer = at::full({2, 9, 107}, 7.0, x.options());
  at::Tensor out = buffer.narrow(-1, 3, 100);
  fused::gelu_tanh_into(x, out);
  at::Tensor got = out.to(at::kDouble), xd = x.to(at::kDouble);
  // 0.5 x (1 + tanh(u)) as x sigmoid(2u): the same function without the cancellation of 1 + tanh
  // in the negative tail, where it would round to 0 even in fp64.
  at::Tensor truth = xd * at::sigmoid(2 * 0.79788456080286535588 * (xd + 0.044715 * xd * xd * xd));
  // Computed in float and rounded once: within half a bf16 ulp of the fp64 value, plus 1e-6 of it
  // for the float arithmetic.
  at::Tensor err = (got - truth).abs();
  at::Tensor bound = 0.5 * bf16_ulp(got) + 1e-6 * truth.abs() + 1e-30;
  const int64_t w = (err / bound).flatten().argmax().item<int64_t>();
  EXPECT_TRUE((err <= bound).all().item<bool>()) << "worst at x " << xd.flatten()[w].item<double>() << ": "
      << got.flatten()[w].item<double>() << " against " << truth.flatten()[w].item<double>();
  // libtorch 1.13's bf16 gelu, which this kernel replaces, is no closer.
  EXPECT_LE(err.max().item<double>(), (at::gelu(x, "tanh").to(at::kDouble) - truth).abs().max().item<double>());
  EXPECT_TRUE(test::identical("columns beside the slice", buffer.narrow(-1, 0, 3), at::full({2, 9, 3}, 7.0, x.options())));
  EXPECT_TRUE(test::identical("columns beside the slice", buffer.narrow(-1, 103, 4), at::full({2, 9, 4}, 7.0, x.options())));
}

TEST(FluxFused, LayerNormModulateIsWithinItsRoundingsOfFp64) {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(6);
  for (int64_t D : {5, 40, 512, 3072}) {
    at::Tensor x = (2 + 3 * at::randn({2, 7, D}, gen)).to(at::kBFloat16);
    // shift and scale as the blocks pass them: chunks of the AdaNorm projection [B, 3 * D].
    at::Tensor mod = (0.5 * at::randn({2, 3 * D}, gen)).to(at::kBFloat16);
    std::vector<at::Tensor> c = mod.chunk(3, 1);
    at::Tensor got = fused::layer_norm_modulate(x, c[0], c[1], 1e-6).to(at::kDouble);
    // The operators' arithmetic in fp64, keeping their one bf16 rounding of an input: 1 + scale.
    at::Tensor t = (1 + c[1].unsqueeze(1)).to(at::kDouble);
    at::Tensor normed = at::layer_norm(x.to(at::kDouble), {D}, {}, {}, 1e-6);
    at::Tensor truth = c[0].unsqueeze(1).to(at::kDouble) + normed * t;
    // Two roundings to nearest bf16, of the normed x and of the result: half an ulp of the normed
    // value times |1 + scale|, plus half an ulp of the result; 1e-6 of the terms' size covers
    // the float mean and variance.
    at::Tensor bound = 0.5 * bf16_ulp(normed) * t.abs() + 0.5 * bf16_ulp(got) +
                       1e-6 * ((normed * t).abs() + c[0].unsqueeze(1).to(at::kDouble).abs());
    at::Tensor err = (got - truth).abs();
    EXPECT_TRUE((err <= bound).all().item<bool>())
        << "layer_norm_modulate D=" << D << ": largest error / bound " << (err / bound).max().item<double>();
    // libtorch 1.13's bf16 layer_norm + addcmul, which this kernel replaces, is no closer.
    at::Tensor ops = at::addcmul(c[0].unsqueeze(1), at::layer_norm(x, {D}, {}, {}, 1e-6), 1 + c[1].unsqueeze(1));
    EXPECT_LE(err.max().item<double>(), (ops.to(at::kDouble) - truth).abs().max().item<double>()) << "D=" << D;
  }
}

// A block in fp32 and bf16 (fused kernels) against the same weights in fp64 (operators only).
template <typename Block, typename Run>
void expect_block_near_fp64(const char* what, Block block, Run run) {
  nn::fill_random(*block, 9);
  nn::cast_parameters(*block, at::kDouble);
  block->fuse();
  at::Tensor ref = run(block, at::kDouble);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    nn::cast_parameters(*block, dtype);
    block->fuse();
    at::Tensor got = run(block, dtype);
    ASSERT_EQ(got.scalar_type(), dtype);
    const double tol = dtype == at::kFloat ? test::kTolFp32 : test::kTolBf16Sanity;
    EXPECT_TRUE(test::close_to(std::string(what) + " in " + nn::dtype_label(dtype) + " vs fp64", got.to(at::kDouble), ref, tol));
  }
}

TEST(FluxFused, BlocksMatchTheirFp64Operators) {
  c10::InferenceMode guard;
  const int64_t D = 32, H = 2, Dh = 16, S = 6;
  const RopeTables rope = tables(S, 6, 8, {4, 6, 6});
  ASSERT_EQ(rope.cos.size(0), S + 12);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const at::Tensor txt = at::randn({1, S, D}, gen, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor img = at::randn({1, 12, D}, gen, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor temb = at::randn({1, D}, gen, at::TensorOptions().dtype(at::kDouble));
  expect_block_near_fp64("double block", DoubleBlock(D, H, Dh), [&](DoubleBlock& b, at::ScalarType dt) {
    auto [t, i] = b->forward(txt.to(dt), img.to(dt), temb.to(dt), rope);
    return at::cat({t, i}, 1);
  });
  expect_block_near_fp64("single block", SingleBlock(D, H, Dh), [&](SingleBlock& b, at::ScalarType dt) {
    return b->forward(at::cat({txt, img}, 1).to(dt), temb.to(dt), rope);
  });
}

}  // namespace
}  // namespace fluxmpi::flux
