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
