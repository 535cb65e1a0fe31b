// The fused CPU kernels of the FLUX blocks (models/flux/fused.h) against the operator-by-operator
// formulation they replace (RMSNormImpl + apply_rope), and whole blocks in fp32 and bf16 against
// the same blocks run in fp64, where every step takes the operator path: without a KV cache, and
// with one through an exact step and then patch windows (patch pipelining).

#include <gtest/gtest.h>

#include <functional>

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
    fused::rms_norm_rope_into(tq, norm->weight, norm->eps, rope, 0, out.narrow(2, 0, S));
    fused::rms_norm_rope_into(iq, norm->weight, norm->eps, rope, S, out.narrow(2, S, L));
    at::Tensor ref = apply_rope(at::cat({norm->forward(tq), norm->forward(iq)}, 1), rope).transpose(1, 2);
    ASSERT_EQ(out.scalar_type(), dtype);
    const double tol = dtype == at::kFloat ? 1e-6 : kOneBf16Ulp;
    EXPECT_TRUE(test::close_to(std::string("rms_norm_rope_into ") + nn::dtype_label(dtype), out, ref, tol));
    // Into the rows of a [B, Ntot, H, Dh] key cache seen as [B, H, N, Dh]: the image rows at
    // offset 3, the cache's other rows untouched.
    at::Tensor cache = at::full({B, S + L + 4, H, Dh}, 7.0, txt.options());
    fused::rms_norm_rope_into(iq, norm->weight, norm->eps, rope, S, cache.narrow(1, 3, L).transpose(1, 2));
    EXPECT_TRUE(test::close_to(std::string("rms_norm_rope_into a cache ") + nn::dtype_label(dtype),
                               cache.narrow(1, 3, L).transpose(1, 2), ref.narrow(2, S, L), tol));
    EXPECT_TRUE(test::identical("cache rows before", cache.narrow(1, 0, 3), at::full({B, 3, H, Dh}, 7.0, txt.options())));
    EXPECT_TRUE(test::identical("cache rows after", cache.narrow(1, 3 + L, S + 1),
                                at::full({B, S + 1, H, Dh}, 7.0, txt.options())));
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

// fp32: the same loop without the bf16 rounding, within float arithmetic of fp64: 1e-6 of the
// value, and in the negative tail e^(-2|u|) turns u's float rounding into a relative error of
// ~|u| ulps (any float formula does), so 1e-6 (1 + |u|).
TEST(FluxFused, GeluTanhIntoFp32IsWithinFloatArithmeticOfFp64) {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
  at::Tensor x = at::cat({4 * at::randn({2, 9, 70}, gen), at::linspace(-12, 12, 2 * 9 * 30).view({2, 9, 30})}, 2);
  at::Tensor buffer = at::full({2, 9, 107}, 7.0, x.options());
  fused::gelu_tanh_into(x, buffer.narrow(-1, 3, 100));
  at::Tensor got = buffer.narrow(-1, 3, 100).to(at::kDouble), xd = x.to(at::kDouble);
  at::Tensor truth = xd * at::sigmoid(2 * 0.79788456080286535588 * (xd + 0.044715 * xd * xd * xd));
  at::Tensor u = 0.79788456080286535588 * (xd + 0.044715 * xd * xd * xd);
  const double worst = ((got - truth).abs() / (1e-6 * (1 + u.abs()) * truth.abs() + 1e-30)).max().item<double>();
  EXPECT_LE(worst, 1.0) << "fp32 gelu_tanh_into: largest error / bound " << worst;
  EXPECT_TRUE(test::identical("columns beside the slice", buffer.narrow(-1, 0, 3), at::full({2, 9, 3}, 7.0, x.options())));
  EXPECT_TRUE(test::identical("columns beside the slice", buffer.narrow(-1, 103, 4), at::full({2, 9, 4}, 7.0, x.options())));
}

// fp32: mean and variance in float in another order than libtorch's layer_norm: within 1e-6 of
// fp64 at the output's scale, as close as the operators it replaces (within 2x), and within
// kTolFp32 of them.
TEST(FluxFused, LayerNormModulateFp32IsWithinFloatArithmeticOfFp64) {
  c10::InferenceMode guard;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(16);
  for (int64_t D : {5, 40, 512, 3072}) {
    at::Tensor x = 2 + 3 * at::randn({2, 7, D}, gen);
    std::vector<at::Tensor> c = (0.5 * at::randn({2, 3 * D}, gen)).chunk(3, 1);
    at::Tensor got = fused::layer_norm_modulate(x, c[0], c[1], 1e-6).to(at::kDouble);
    at::Tensor t = (1 + c[1].unsqueeze(1)).to(at::kDouble), shift = c[0].unsqueeze(1).to(at::kDouble);
    at::Tensor term = at::layer_norm(x.to(at::kDouble), {D}, {}, {}, 1e-6) * t;
    const at::Tensor truth = shift + term;
    EXPECT_TRUE(test::close_to("fp32 layer_norm_modulate vs fp64, D=" + std::to_string(D), got, truth, 1e-6));
    at::Tensor ops = at::addcmul(c[0].unsqueeze(1), at::layer_norm(x, {D}, {}, {}, 1e-6), 1 + c[1].unsqueeze(1));
    const double ours = (got - truth).abs().max().item<double>();
    const double theirs = (ops.to(at::kDouble) - truth).abs().max().item<double>();
    EXPECT_LE(ours, 2 * theirs) << "D=" << D << ": max |diff| from fp64 " << ours << ", the operators' " << theirs;
    EXPECT_TRUE(test::close_to("fp32 layer_norm_modulate vs the operators, D=" + std::to_string(D), got, ops, test::kTolFp32));
  }
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

// Patch pipelining as pipeline/denoise.cpp drives a block: an exact step filling the KV cache,
// then the next step in three windows (the text with the first), each writing its rows of the
// cache before attending to all of them. The fused path (fp32, bf16: tiled attention over the
// cache) against the operator path in fp64: every window's output and the caches at the end.
TEST(FluxFused, BlocksWithAKvCacheMatchTheirFp64Operators) {
  c10::InferenceMode guard;
  const int64_t D = 32, H = 2, Dh = 16, S = 6, L = 12;
  const RopeTables rope = tables(S, 6, 8, {4, 6, 6});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(10);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor txt = at::randn({1, S, D}, gen, f64), img = at::randn({1, L, D}, gen, f64);
  const at::Tensor txt2 = at::randn({1, S, D}, gen, f64), img2 = at::randn({1, L, D}, gen, f64);
  const at::Tensor temb = at::randn({1, D}, gen, f64);
  struct Window {
    int64_t text, first, count;  // text tokens, first image token, image tokens
    int64_t offset(int64_t S_) const { return text > 0 ? 0 : S_ + first; }
  };
  const std::vector<Window> windows = {{S, 0, 4}, {0, 4, 4}, {0, 8, 4}};
  const auto rows_of = [&](const Window& w) {
    const int64_t o = w.offset(S), n = w.text + w.count;
    return RopeTables{rope.cos.narrow(0, o, n), rope.sin.narrow(0, o, n)};
  };
  const auto cache = [&](at::ScalarType dt) {
    return KvCache{at::zeros({1, S + L, H, Dh}, f64.dtype(dt)), at::zeros({1, S + L, H, Dh}, f64.dtype(dt)), 0};
  };
  expect_block_near_fp64("double block with a KV cache", DoubleBlock(D, H, Dh), [&](DoubleBlock& b, at::ScalarType dt) {
    KvCache kv = cache(dt);
    auto [t, i] = b->forward(txt.to(dt), img.to(dt), temb.to(dt), rope, &kv);
    std::vector<at::Tensor> out = {t, i};
    for (const Window& w : windows) {
      kv.offset = w.offset(S);
      auto [tw, iw] = b->forward(txt2.narrow(1, 0, w.text).to(dt), img2.narrow(1, w.first, w.count).to(dt), temb.to(dt),
                                 rows_of(w), &kv);
      out.insert(out.end(), {tw, iw});
    }
    out.insert(out.end(), {kv.k.flatten(2), kv.v.flatten(2)});
    return at::cat(out, 1);
  });
  const at::Tensor x = at::cat({txt, img}, 1), x2 = at::cat({txt2, img2}, 1);
  expect_block_near_fp64("single block with a KV cache", SingleBlock(D, H, Dh), [&](SingleBlock& b, at::ScalarType dt) {
    KvCache kv = cache(dt);
    std::vector<at::Tensor> out = {b->forward(x.to(dt), temb.to(dt), rope, &kv)};
    for (const Window& w : windows) {
      kv.offset = w.offset(S);
      out.push_back(b->forward(x2.narrow(1, kv.offset, w.text + w.count).to(dt), temb.to(dt), rows_of(w), &kv));
    }
    out.insert(out.end(), {kv.k.flatten(2), kv.v.flatten(2)});
    return at::cat(out, 1);
  });
}

// Reference tokens (Kontext's, FLUX.2's multi-reference) follow the image tokens and travel with
// the first window, like the text: its rows are [0, S + 4) and the sequence's last R rows
// (KvCache::tail). The fused path against the fp64 operator path as above; and every window writes
// its keys and values where the sequence has them: after the step's windows the caches equal those
// an exact call on the step's inputs leaves (a token's key and value depend on
// that token's input alone).
TEST(FluxFused, ReferenceTokensTravelWithTheFirstWindow) {
  c10::InferenceMode guard;
  const int64_t D = 32, H = 2, Dh = 16, S = 6, L = 12, R = 6;
  const RopeTables rope =
      rope_tables(at::cat({text_position_ids(S), image_position_ids(6, 8), reference_position_ids(4, 6)}, 0), {4, 6, 6});
  ASSERT_EQ(rope.cos.size(0), S + L + R);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = at::randn({1, S + L + R, D}, gen, f64), x2 = at::randn({1, S + L + R, D}, gen, f64);
  const at::Tensor temb = at::randn({1, D}, gen, f64);
  struct Window {
    int64_t text, first, count, tail;  // text tokens, first image token, image tokens, reference tokens
    int64_t offset(int64_t S_) const { return text > 0 ? 0 : S_ + first; }
  };
  const std::vector<Window> windows = {{S, 0, 4, R}, {0, 4, 4, 0}, {0, 8, 4, 0}};
  const auto rows = [&](const at::Tensor& t, const Window& w, int64_t dim) {
    const at::Tensor head = t.narrow(dim, w.offset(S), w.text + w.count);
    return w.tail == 0 ? head : at::cat({head, t.narrow(dim, S + L, w.tail)}, dim);
  };
  const auto rows_of = [&](const Window& w) { return RopeTables{rows(rope.cos, w, 0), rows(rope.sin, w, 0)}; };
  const auto cache = [&](at::ScalarType dt) {
    return KvCache{at::zeros({1, S + L + R, H, Dh}, f64.dtype(dt)), at::zeros({1, S + L + R, H, Dh}, f64.dtype(dt)), 0, 0};
  };
  const auto windowed = [&](SingleBlock& b, at::ScalarType dt, KvCache& kv) {
    std::vector<at::Tensor> out;
    for (const Window& w : windows) {
      kv.offset = w.offset(S);
      kv.tail = w.tail;
      out.push_back(b->forward(rows(x2, w, 1).to(dt), temb.to(dt), rows_of(w), &kv));
    }
    return out;
  };
  expect_block_near_fp64("single block with reference tokens", SingleBlock(D, H, Dh), [&](SingleBlock& b, at::ScalarType dt) {
    KvCache kv = cache(dt);
    std::vector<at::Tensor> out = {b->forward(x.to(dt), temb.to(dt), rope, &kv)};
    for (const at::Tensor& t : windowed(b, dt, kv)) out.push_back(t);
    out.insert(out.end(), {kv.k.flatten(2), kv.v.flatten(2)});
    return at::cat(out, 1);
  });
  expect_block_near_fp64("double block with reference tokens", DoubleBlock(D, H, Dh), [&](DoubleBlock& b, at::ScalarType dt) {
    KvCache kv = cache(dt);
    auto [t, i] = b->forward(x.narrow(1, 0, S).to(dt), x.narrow(1, S, L + R).to(dt), temb.to(dt), rope, &kv);
    std::vector<at::Tensor> out = {t, i};
    for (const Window& w : windows) {
      kv.offset = w.offset(S);
      kv.tail = w.tail;
      const at::Tensor in = rows(x2, w, 1);
      auto [tw, iw] = b->forward(in.narrow(1, 0, w.text).to(dt), in.narrow(1, w.text, in.size(1) - w.text).to(dt),
                                 temb.to(dt), rows_of(w), &kv);
      out.insert(out.end(), {tw, iw});
    }
    out.insert(out.end(), {kv.k.flatten(2), kv.v.flatten(2)});
    return at::cat(out, 1);
  });
  SingleBlock block(D, H, Dh);
  nn::fill_random(*block, 13);
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    nn::cast_parameters(*block, dt);
    block->fuse();
    KvCache windows_kv = cache(dt), exact_kv = cache(dt);
    block->forward(x.to(dt), temb.to(dt), rope, &windows_kv);
    windowed(block, dt, windows_kv);
    block->forward(x2.to(dt), temb.to(dt), rope, &exact_kv);
    // Rows land where the sequence has them (a misplaced row is off by O(1)): bit for bit in fp32,
    // the dtype runs use; in fp64 the fused projection over a window's rows rounds some values
    // differently from the whole sequence's (measured 2.3e-7 relative), so there within 1e-6.
    if (dt == at::kFloat) {
      EXPECT_TRUE(test::identical(std::string("keys after the windows, ") + nn::dtype_label(dt), windows_kv.k, exact_kv.k));
      EXPECT_TRUE(test::identical(std::string("values after the windows, ") + nn::dtype_label(dt), windows_kv.v, exact_kv.v));
    } else {
      test::expect_close(std::string("keys after the windows, ") + nn::dtype_label(dt), windows_kv.k, exact_kv.k, 1e-6);
      test::expect_close(std::string("values after the windows, ") + nn::dtype_label(dt), windows_kv.v, exact_kv.v, 1e-6);
    }
  }
}

// make_kv_cache keeps the keys transposed and the values heads-first where the tiled attention
// runs (CPU fp32, bf16), so that it reads them in place. The same numbers as the sequence-first
// layout: every window's output, through the fused path (fp32, bf16) and through the operator
// path (rope_attention, FLUX.2's; fp32), and the caches' keys and values at the end, bit for bit,
// with reference tokens in the first window (KvCache::tail).
TEST(FluxFused, HeadsFirstCachesGiveTheSameBits) {
  c10::InferenceMode guard;
  const int64_t D = 32, H = 2, Dh = 16, S = 6, L = 12, R = 6, N = S + L + R;
  const RopeTables rope =
      rope_tables(at::cat({text_position_ids(S), image_position_ids(6, 8), reference_position_ids(4, 6)}, 0), {4, 6, 6});
  EXPECT_FALSE(make_kv_cache(1, N, H, Dh, at::TensorOptions().dtype(at::kDouble)).heads_first)
      << "fp64 runs the math path: sequence-first";
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(14);
  const at::Tensor x = at::randn({1, N, D}, gen, at::kDouble), x2 = at::randn({1, N, D}, gen, at::kDouble);
  const at::Tensor temb = at::randn({1, D}, gen, at::kDouble);
  struct Window {
    int64_t offset, count, tail;  // first sequence row, rows there, reference rows at the end
  };
  const std::vector<Window> windows = {{0, S + 4, R}, {S + 4, 4, 0}, {S + 8, 4, 0}};
  const auto rows = [&](const at::Tensor& t, const Window& w, int64_t dim) {
    const at::Tensor head = t.narrow(dim, w.offset, w.count);
    return w.tail == 0 ? head : at::cat({head, t.narrow(dim, S + L, w.tail)}, dim);
  };
  // An exact call filling the cache, then the windows; every output and the cache's contents.
  const auto run = [&](const std::function<at::Tensor(const at::Tensor&, const RopeTables&, KvCache*)>& call, KvCache kv,
                       at::ScalarType dt) {
    std::vector<at::Tensor> out = {call(x.to(dt), rope, &kv)};
    for (const Window& w : windows) {
      kv.offset = w.offset;
      kv.tail = w.tail;
      out.push_back(call(rows(x2, w, 1).to(dt), RopeTables{rows(rope.cos, w, 0), rows(rope.sin, w, 0)}, &kv));
    }
    out.insert(out.end(), {kv.keys().contiguous().flatten(), kv.values().contiguous().flatten()});
    return out;
  };
  const auto compare = [&](const std::string& what, const std::function<at::Tensor(const at::Tensor&, const RopeTables&, KvCache*)>& call,
                           at::ScalarType dt) {
    const auto o = at::TensorOptions().dtype(dt);
    KvCache first = make_kv_cache(1, N, H, Dh, o);
    ASSERT_TRUE(first.heads_first) << what;
    const std::vector<at::Tensor> heads = run(call, first, dt);
    const std::vector<at::Tensor> sequence = run(call, KvCache{at::zeros({1, N, H, Dh}, o), at::zeros({1, N, H, Dh}, o)}, dt);
    for (size_t i = 0; i < heads.size(); ++i)
      EXPECT_TRUE(test::identical(what + ", output " + std::to_string(i), heads[i], sequence[i]));
  };
  SingleBlock block(D, H, Dh);
  nn::fill_random(*block, 15);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    nn::cast_parameters(*block, dt);
    block->fuse();
    const at::Tensor t = temb.to(dt);
    compare(std::string("single block, ") + nn::dtype_label(dt),
            [&](const at::Tensor& in, const RopeTables& r, KvCache* kv) { return block->forward(in, t, r, kv); }, dt);
  }
  // The operator path: q, k, v [B, n, H, Dh] made from the window's input (D = H * Dh).
  compare("rope_attention, fp32", [&](const at::Tensor& in, const RopeTables& r, KvCache* kv) {
    const at::Tensor heads = in.view({1, in.size(1), H, Dh});
    return rope_attention(heads, 0.5 * heads, heads - 1, r, kv);
  }, at::kFloat);
}

}  // namespace
}  // namespace fluxmpi::flux
