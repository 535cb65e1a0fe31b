// The tiled attention with an online softmax (models/common/tiled_attention.h) against a float64
// softmax(q k^T * scale + bias) v and against the math path, over the shapes that exercise its
// tiles: lengths below, at and across the query and key tile sizes (odd ones included), query
// windows over longer key sequences (patch pipelining), value widths unlike the key width,
// additive biases broadcast in every way, causal masks, fully masked rows, strided views in and
// out; in fp32 and in bf16 (fp32 accumulation, also with oneDNN switched off); through oneDNN's
// GEMMs and through the libtorch fallback; and the same bits whatever the thread count. Also the
// GEMMs it is built on.

#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "models/common/attention.h"
#include "models/common/cpu_gemm.h"
#include "models/common/cpu_math.h"
#include "models/common/tensor_utils.h"
#include "models/common/tiled_attention.h"
#include "support/onednn_switch.h"
#include "support/tensor_compare.h"

namespace fluxmpi::nn {
namespace {

// Against float64, relative to max(1, max |ref|): fp32's rounding over thousands of keys; bf16's
// output rounding (half an ulp, 2^-9) plus the bf16 exponentials entering the second GEMM, within
// two ulps of the output scale. The math path in bf16 rounds the scores too and needs more
// (attention_paths_test.cpp's 5e-2).
constexpr double kFp32Tol = 1e-5, kBf16Tol = 2 * 3.90625e-3;

struct Shape {
  const char* name;
  int64_t B, H, Lq, Lk, Dh, Dv;
};

// kTileQueries = 64, kTileKeys = 512.
const Shape kShapes[] = {
    {"one_query_one_key", 1, 1, 1, 1, 8, 8},
    {"odd_small", 2, 3, 7, 7, 5, 5},
    {"one_query_tile", 1, 2, 64, 64, 16, 16},
    {"query_tile_plus_one", 1, 2, 65, 65, 16, 16},
    {"key_tiles_and_a_half", 1, 2, 131, 1300, 32, 32},
    {"key_tile_exactly", 2, 1, 70, 512, 16, 16},
    {"key_tile_plus_one", 1, 1, 3, 513, 16, 16},
    {"window_of_queries", 1, 4, 97, 640, 64, 64},
    {"value_width_differs", 2, 2, 33, 600, 24, 40},
};

double scale_of(const Shape& s) { return 1.0 / std::sqrt(static_cast<double>(s.Dh)); }

at::Tensor truth(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double scale,
                 bool causal) {
  at::Tensor scores = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-2, -1)) * scale;
  if (bias.defined()) scores = scores + bias.to(at::kDouble);
  if (causal)
    scores = scores.masked_fill(at::ones({q.size(2), k.size(2)}, at::kBool).triu(1), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v.to(at::kDouble));
}

at::Tensor tiled(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double scale,
                 bool causal) {
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  tiled_attention_into(q, k, v, out, scale, bias, causal);
  return out;
}

double tol_of(at::ScalarType t) { return t == at::kFloat ? kFp32Tol : kBf16Tol; }

struct Inputs {
  at::Tensor q, k, v;
};
Inputs inputs(const Shape& s, at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  // Scores of a few units, as in trained models (RMS-normed q and k): softmax neither flat nor one-hot.
  return {(2 * at::randn({s.B, s.H, s.Lq, s.Dh})).to(dtype), (2 * at::randn({s.B, s.H, s.Lk, s.Dh})).to(dtype),
          at::randn({s.B, s.H, s.Lk, s.Dv}).to(dtype)};
}

class TiledShapes : public testing::TestWithParam<Shape> {};

TEST_P(TiledShapes, MatchesFloat64AndTheMathPath) {
  c10::InferenceMode guard;
  const Shape& s = GetParam();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const Inputs in = inputs(s, dtype, 1);
    const at::Tensor got = tiled(in.q, in.k, in.v, {}, scale_of(s), false);
    ASSERT_EQ(got.scalar_type(), dtype);
    const std::string what = std::string(s.name) + " " + at::toString(dtype);
    EXPECT_TRUE(test::close_to(what + " vs float64", got, truth(in.q, in.k, in.v, {}, scale_of(s), false), tol_of(dtype)));
    if (dtype == at::kFloat)
      EXPECT_TRUE(test::close_to(what + " vs the math path", got,
                                 attention_via(AttentionPath::Math, in.q, in.k, in.v, {}, scale_of(s)), kFp32Tol));
  }
}

TEST_P(TiledShapes, CausalAndBiasMatchFloat64) {
  c10::InferenceMode guard;
  const Shape& s = GetParam();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const Inputs in = inputs(s, dtype, 2);
    const std::string what = std::string(s.name) + " " + at::toString(dtype);
    // Biases of every broadcast: per head and query (T5's [1, H, Lq, Lk]), per key only ([B, 1, 1, Lk]),
    // one for all; with -inf entries (a padding mask).
    at::Tensor per_head = at::randn({1, s.H, s.Lq, s.Lk}).to(dtype);
    at::Tensor per_key = at::randn({s.B, 1, 1, s.Lk});
    if (s.Lk > 1) per_key.select(3, s.Lk - 1).fill_(-std::numeric_limits<float>::infinity());
    at::Tensor scalar = at::full({1, 1, 1, 1}, 0.5);
    for (const at::Tensor& bias : {per_head, per_key, scalar})
      EXPECT_TRUE(test::close_to(what + " bias " + shape_string(bias.sizes()), tiled(in.q, in.k, in.v, bias, 0.3, false),
                                 truth(in.q, in.k, in.v, bias, 0.3, false), tol_of(dtype)));
    if (s.Lq <= s.Lk) {
      EXPECT_TRUE(test::close_to(what + " causal", tiled(in.q, in.k, in.v, {}, scale_of(s), true),
                                 truth(in.q, in.k, in.v, {}, scale_of(s), true), tol_of(dtype)));
      EXPECT_TRUE(test::close_to(what + " causal with bias", tiled(in.q, in.k, in.v, per_head, 1.0, true),
                                 truth(in.q, in.k, in.v, per_head, 1.0, true), tol_of(dtype)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TiledShapes, testing::ValuesIn(kShapes),
                         [](const testing::TestParamInfo<Shape>& i) { return std::string(i.param.name); });

// The layouts FLUX passes: q [B, H, N, Dh] contiguous, keys and values as [B, Ntot, H, Dh] caches
// seen through transpose(1, 2), the output into a column slice of a wider [B, N, W] buffer, which
// must keep its other columns.
TEST(TiledAttention, StridedViewsInAndOut) {
  c10::InferenceMode guard;
  at::manual_seed(3);
  const int64_t B = 2, H = 3, N = 100, Dh = 16;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor q = at::randn({B, H, N, Dh}).to(dtype);
    at::Tensor kc = at::randn({B, N, H, Dh}).to(dtype), vc = at::randn({B, N, H, Dh}).to(dtype);
    at::Tensor buffer = at::full({B, N, H * Dh + 7}, 9.0, q.options());
    at::Tensor out = buffer.narrow(2, 3, H * Dh).view({B, N, H, Dh}).transpose(1, 2);
    tiled_attention_into(q, kc.transpose(1, 2), vc.transpose(1, 2), out, 0.25);
    const std::string what = std::string("strided ") + at::toString(dtype);
    EXPECT_TRUE(test::close_to(what, out, truth(q, kc.transpose(1, 2), vc.transpose(1, 2), {}, 0.25, false), tol_of(dtype)));
    EXPECT_TRUE(test::identical(what + ": columns before", buffer.narrow(2, 0, 3), at::full({B, N, 3}, 9.0, q.options())));
    EXPECT_TRUE(test::identical(what + ": columns after", buffer.narrow(2, 3 + H * Dh, 4), at::full({B, N, 4}, 9.0, q.options())));
  }
}

// Keys and values whose rows are spread over a wider matrix ([B, L, H, Dh] seen as [B, H, L, Dh],
// as the FLUX blocks pass them) are gathered into one run of memory when more than one query block
// reads them: the same bits as the same keys and values made contiguous, with one query block and
// with several (1, 2 and 3 blocks of kTileQueries). Keys given as a view of contiguous
// [B, H, Dh, Lk] ones (a heads-first flux::KvCache) are read in place, without the copy into that
// layout: the same bits again, through tiled_attention_into and through nn::attention.
TEST(TiledAttention, KeyAndValueLayoutsGiveTheSameBits) {
  c10::InferenceMode guard;
  at::manual_seed(5);
  const int64_t B = 1, H = 4, Lk = 700, Dh = 32;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor kc = (2 * at::randn({B, Lk, H, Dh})).to(dtype), vc = at::randn({B, Lk, H, Dh}).to(dtype);
    for (int64_t Lq : {kTileQueries, kTileQueries + 1, 3 * kTileQueries}) {
      const at::Tensor q = (2 * at::randn({B, H, Lq, Dh})).to(dtype);
      const at::Tensor spread = tiled(q, kc.transpose(1, 2), vc.transpose(1, 2), {}, 0.2, false);
      const at::Tensor packed = tiled(q, kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous(), {}, 0.2, false);
      const std::string what = std::string(at::toString(dtype)) + " Lq " + std::to_string(Lq);
      EXPECT_TRUE(test::identical("gathered " + what, spread, packed));
      const at::Tensor kt = kc.permute({0, 2, 3, 1}).contiguous();  // [B, H, Dh, Lk]
      ASSERT_TRUE(keys_transposed(kt.transpose(2, 3)));
      ASSERT_FALSE(keys_transposed(kc.transpose(1, 2)));
      EXPECT_TRUE(test::identical("transposed keys " + what, tiled(q, kt.transpose(2, 3), vc.transpose(1, 2), {}, 0.2, false),
                                  packed));
      EXPECT_TRUE(test::identical("nn::attention, transposed keys " + what,
                                  attention_via(AttentionPath::Tiled, q, kt.transpose(2, 3), vc.transpose(1, 2), {}, 0.2),
                                  packed));
    }
  }
}

// A row whose scores are all -inf is 0 / 0 = NaN, as softmax makes it; the other rows are not
// touched by it.
TEST(TiledAttention, FullyMaskedRowIsNaNAsSoftmaxGivesIt) {
  c10::InferenceMode guard;
  at::manual_seed(4);
  at::Tensor q = at::randn({1, 1, 5, 8}), k = at::randn({1, 1, 600, 8}), v = at::randn({1, 1, 600, 8});
  at::Tensor bias = at::zeros({1, 1, 5, 600});
  bias[0][0][2].fill_(-std::numeric_limits<float>::infinity());
  at::Tensor got = tiled(q, k, v, bias, 0.5, false);
  EXPECT_TRUE(at::isnan(got[0][0][2]).all().item<bool>());
  EXPECT_TRUE(at::isnan(attention_via(AttentionPath::Math, q, k, v, bias, 0.5)[0][0][2]).all().item<bool>());
  const at::Tensor rows = at::tensor({0, 1, 3, 4});
  EXPECT_TRUE(test::close_to("unmasked rows", got.index_select(2, rows), truth(q, k, v, bias, 0.5, false).index_select(2, rows),
                             kFp32Tol));
}

// Scores far apart across key tiles: the running maximum grows in a later tile (the earlier rows
// are rescaled) and a later tile holds only negligible keys (exponentials underflow to 0).
TEST(TiledAttention, RunningMaximumAcrossKeyTiles) {
  c10::InferenceMode guard;
  at::manual_seed(5);
  at::Tensor q = at::randn({1, 2, 10, 16}), v = at::randn({1, 2, 1500, 16});
  at::Tensor bias = at::zeros({1, 1, 1, 1500});
  bias.narrow(3, 0, 512).fill_(-40);     // first tile: far below the rest
  bias.narrow(3, 700, 100).fill_(30);    // second tile: the maximum
  bias.narrow(3, 1024, 476).fill_(-120);  // third tile: underflows
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor k = at::randn({1, 2, 1500, 16});
    const std::string what = std::string("running maximum ") + at::toString(dtype);
    EXPECT_TRUE(test::close_to(what, tiled(q.to(dtype), k.to(dtype), v.to(dtype), bias, 0.25, false),
                               truth(q.to(dtype), k.to(dtype), v.to(dtype), bias, 0.25, false), tol_of(dtype)));
  }
}

// The softmax's exponential (scores in base 2): 2^x for x in [-126, 0] within 2 float ulps
// (2^-22 relative) of the exact value, measured at every 1/4096 and at each integer +- 1/2,
// where the range reduction switches; exactly 1 at 0; 0 below 2^-126 and at -inf.
TEST(TiledAttention, BaseTwoExponential) {
  double worst = 0;
  auto check = [&](float x) {
    const double exact = std::exp2(static_cast<double>(x));
    worst = std::max(worst, std::abs(cpu::exp2_nonpositive(x) - exact) / exact);
  };
  for (int i = 0; i <= 126 * 4096; ++i) check(-static_cast<float>(i) / 4096);
  for (int n = 1; n <= 125; ++n)
    for (float d : {-0.5f, 0.5f}) check(std::nextafter(-static_cast<float>(n) + d, 0.0f));
  EXPECT_LE(worst, std::ldexp(1.0, -22));
  EXPECT_EQ(cpu::exp2_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(cpu::exp2_nonpositive(-126.5f), 0.0f);
  EXPECT_EQ(cpu::exp2_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
  std::printf("2^x on [-126, 0]: largest relative error %.3g\n", worst);
}

// bf16 accumulates in fp32: over 4096 keys of nearly equal weight (8 key tiles) its error stays at
// the output's own rounding. Largest |diff| from float64.
double bf16_error_over_4096_keys() {
  const Shape s{"long", 1, 2, 64, 4096, 64, 64};
  Inputs in = inputs(s, at::kBFloat16, 6);
  in.q = (in.q.to(at::kFloat) * 0.05).to(at::kBFloat16);  // nearly uniform weights
  in.v = (in.v.to(at::kFloat) + 3).to(at::kBFloat16);     // values far from 0: each weighted sum ~3
  const at::Tensor ref = truth(in.q, in.k, in.v, {}, scale_of(s), false);
  return (tiled(in.q, in.k, in.v, {}, scale_of(s), false).to(at::kDouble) - ref).abs().max().item<double>();
}
// Half a bf16 ulp at 3 (2^-6 / 2 = 0.0078), and half that again for the exponentials' roundings.
constexpr double kBf16LongBound = 0.0117;

TEST(TiledAttention, Bf16AccumulatesInFp32) {
  c10::InferenceMode guard;
  const double err = bf16_error_over_4096_keys();
  EXPECT_LE(err, kBf16LongBound) << "bf16 over 4096 keys: max |diff| " << err;
}

// A CPU without AVX-512 has neither oneDNN's bf16 GEMM (the probe in cpu_gemm.cpp finds it
// unimplemented) nor libtorch's oneDNN matmuls, and libtorch 1.13's own bf16 matmul then sums in
// bf16 (docs/architecture.md, "Numerics"). Emulated: libtorch's oneDNN switched off and the
// libtorch GEMMs forced; the sums must stay fp32.
TEST(TiledAttention, Bf16AccumulatesInFp32WithoutOneDnn) {
  c10::InferenceMode guard;
  struct LibtorchGemms {
    LibtorchGemms() { cpu::force_gemm_provider(cpu::GemmProvider::Libtorch); }
    ~LibtorchGemms() { cpu::force_gemm_provider(cpu::GemmProvider::OneDnn); }
  };
  test::OneDnnSwitch off(false);
  LibtorchGemms libtorch;
  ASSERT_EQ(cpu::gemm_provider_bf16(), cpu::GemmProvider::Libtorch);
  const double err = bf16_error_over_4096_keys();
  EXPECT_LE(err, kBf16LongBound) << "bf16 over 4096 keys without oneDNN: max |diff| " << err;
}

// Each (batch, head, query block) is one task with fixed sums: the thread count changes no bit,
// and calling again changes none either.
TEST(TiledAttention, SameBitsForAnyThreadCount) {
  c10::InferenceMode guard;
  const Shape s{"threads", 2, 3, 200, 700, 32, 32};
  const int saved = at::get_num_threads();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const Inputs in = inputs(s, dtype, 7);
    at::set_num_threads(1);
    const at::Tensor one = tiled(in.q, in.k, in.v, {}, 0.2, true);
    at::set_num_threads(2);
    const at::Tensor two = tiled(in.q, in.k, in.v, {}, 0.2, true);
    const at::Tensor again = tiled(in.q, in.k, in.v, {}, 0.2, true);
    at::set_num_threads(saved);
    EXPECT_TRUE(test::identical(std::string("1 and 2 threads ") + at::toString(dtype), two, one));
    EXPECT_TRUE(test::identical(std::string("the same call twice ") + at::toString(dtype), again, two));
  }
}

// The libtorch fallback (no oneDNN in the process, or no bf16 GEMM on the CPU) computes the same
// attention.
TEST(TiledAttention, LibtorchGemmsGiveTheSameAttention) {
  c10::InferenceMode guard;
  const Shape s{"fallback", 1, 2, 70, 600, 16, 24};
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const Inputs in = inputs(s, dtype, 8);
    const at::Tensor fast = tiled(in.q, in.k, in.v, {}, 0.3, false);
    cpu::force_gemm_provider(cpu::GemmProvider::Libtorch);
    const at::Tensor slow = tiled(in.q, in.k, in.v, {}, 0.3, false);
    cpu::force_gemm_provider(cpu::GemmProvider::OneDnn);
    const std::string what = std::string("libtorch GEMMs ") + at::toString(dtype);
    EXPECT_TRUE(test::close_to(what + " vs float64", slow, truth(in.q, in.k, in.v, {}, 0.3, false), tol_of(dtype)));
    EXPECT_TRUE(test::close_to(what + " vs oneDNN's", slow, fast, tol_of(dtype)));
  }
}

TEST(TiledAttention, RefusesBadInputs) {
  at::Tensor q = at::randn({1, 2, 4, 8});
  at::Tensor out = at::empty({1, 2, 4, 8});
  EXPECT_THROW(tiled_attention_into(q, q.narrow(2, 0, 0), q.narrow(2, 0, 0), out, 1.0), std::exception);  // no keys
  EXPECT_THROW(tiled_attention_into(q, at::randn({1, 2, 4, 6}), q, out, 1.0), std::exception);        // key width
  EXPECT_THROW(tiled_attention_into(q, q.to(at::kBFloat16), q, out, 1.0), std::exception);            // dtypes
  EXPECT_THROW(tiled_attention_into(q.to(at::kDouble), q.to(at::kDouble), q.to(at::kDouble), out.to(at::kDouble), 1.0),
               std::exception);
  EXPECT_THROW(tiled_attention_into(q, q, q, at::empty({1, 2, 8, 4}).transpose(2, 3), 1.0), std::exception);  // last stride
}

// The GEMMs under it, both providers, against at::matmul in float64: leading dimensions wider than
// the rows, B transposed or not, beta 0 (C's old contents ignored, NaN included) and 1.
TEST(CpuGemm, BothProvidersMatchMatmul) {
  c10::InferenceMode guard;
  at::manual_seed(9);
  const int64_t M = 37, N = 29, K = 71;
  for (cpu::GemmProvider provider : {cpu::GemmProvider::OneDnn, cpu::GemmProvider::Libtorch}) {
    cpu::force_gemm_provider(provider);
    for (bool bf16 : {false, true}) {
      for (bool tb : {false, true}) {
        at::Tensor a = at::randn({M, K + 3}), b = tb ? at::randn({N, K + 5}) : at::randn({K, N + 5});
        if (bf16) {
          a = a.to(at::kBFloat16);
          b = b.to(at::kBFloat16);
        }
        at::Tensor av = a.narrow(1, 0, K), bv = tb ? b.narrow(1, 0, K) : b.narrow(1, 0, N);
        const at::Tensor product = at::matmul(av.to(at::kDouble), tb ? bv.to(at::kDouble).t() : bv.to(at::kDouble));
        at::Tensor c = at::full({M, N + 2}, std::numeric_limits<float>::quiet_NaN());
        at::Tensor c0 = at::randn({M, N});
        for (float beta : {0.0f, 1.0f}) {
          at::Tensor cv = c.narrow(1, 0, N);
          if (beta == 1.0f) cv.copy_(c0);
          if (bf16)
            cpu::gemm(tb, M, N, K, 0.5f, a.data_ptr<c10::BFloat16>(), a.stride(0), b.data_ptr<c10::BFloat16>(), b.stride(0),
                      beta, c.data_ptr<float>(), c.stride(0));
          else
            cpu::gemm(tb, M, N, K, 0.5f, a.data_ptr<float>(), a.stride(0), b.data_ptr<float>(), b.stride(0), beta,
                      c.data_ptr<float>(), c.stride(0));
          const at::Tensor want = 0.5 * product + (beta == 1.0f ? c0.to(at::kDouble) : at::zeros_like(product));
          const std::string what = std::string(provider == cpu::GemmProvider::OneDnn ? "oneDNN" : "libtorch") +
                                   (bf16 ? " bf16" : " fp32") + (tb ? " B^T" : " B") + " beta " + std::to_string(beta);
          EXPECT_TRUE(test::close_to(what, cv, want, 1e-5));
          EXPECT_TRUE(at::isnan(c.narrow(1, N, 2)).all().item<bool>()) << what << ": columns beyond N were written";
        }
      }
    }
  }
  cpu::force_gemm_provider(cpu::GemmProvider::OneDnn);
}

}  // namespace
}  // namespace fluxmpi::nn
