#include "models/common/tiled_attention.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "core/error.h"
#include "models/common/cpu_gemm.h"
#include "models/common/cpu_math.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::nn {
namespace {

using cpu::exp2_nonpositive;
using cpu::to_float;

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
// The scores are kept in base 2 (times log2 e, folded into the GEMM's scale), so that the
// softmax's exponentials are powers of 2, whose range reduction is exact and shorter:
// 2^(x log2 e) = e^x.
constexpr double kLog2e = 1.4426950408889634;

// The loops below keep 16 partial results (one AVX-512 vector, two AVX2 ones), combined in a fixed
// pairwise order at the end.
constexpr int kLanes = 16;

inline float combine_sum(const float* part) {
  float p8[8];
  for (int j = 0; j < 8; ++j) p8[j] = part[j] + part[j + 8];
  return ((p8[0] + p8[4]) + (p8[1] + p8[5])) + ((p8[2] + p8[6]) + (p8[3] + p8[7]));
}

FLUXMPI_VECTOR_CLONES float row_max(const float* s, int64_t n) {
  float part[kLanes];
  for (int j = 0; j < kLanes; ++j) part[j] = kMinusInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] = part[j] < s[i + j] ? s[i + j] : part[j];
  for (; i < n; ++i) part[0] = part[0] < s[i] ? s[i] : part[0];
  float m = part[0];
  for (int j = 1; j < kLanes; ++j) m = m < part[j] ? part[j] : m;
  return m;
}

// s[i] <- 2^(s[i] - m) in place; returns their sum. One pass: the sum is kept beside.
FLUXMPI_VECTOR_CLONES float exp_row(float* s, int64_t n, float m) {
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float e = exp2_nonpositive(s[i + j] - m);
      s[i + j] = e;
      part[j] += e;
    }
  for (; i < n; ++i) {
    s[i] = exp2_nonpositive(s[i] - m);
    part[0] += s[i];
  }
  return combine_sum(part);
}

// bf16 copies of a row of floats (the exponentials that enter the bf16 GEMM). A loop of its own: in
// one loop with the exponentials GCC vectorised both at half width.
FLUXMPI_VECTOR_CLONES void to_bf16_row(const float* s, c10::BFloat16* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = cpu::from_float<c10::BFloat16>(s[i]);
}

FLUXMPI_VECTOR_CLONES void scale_row(float* o, int64_t n, float c) {
  for (int64_t i = 0; i < n; ++i) o[i] *= c;
}

template <typename T>
FLUXMPI_VECTOR_CLONES void divide_row_into(const float* o, int64_t n, float l, T* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = cpu::from_float<T>(o[i] / l);
}

// A single row's stride is arbitrary (libtorch ignores the strides of size-1 dimensions); as a
// GEMM's leading dimension it must be at least the row's width.
struct Strides {
  int64_t b, h, row;
  explicit Strides(const at::Tensor& t)
      : b(t.stride(0)), h(t.stride(1)), row(t.size(2) == 1 ? std::max(t.stride(2), t.size(3)) : t.stride(2)) {}
};

template <typename T>
// kt: the keys transposed, [B, H, Dh, Lk] contiguous; log2_scale: the scale times log2 e.
void tiled_kernel(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v, const at::Tensor& out,
                  float log2_scale, const at::Tensor& bias, bool causal) {
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Dh = q.size(3), Lk = kt.size(3), Dv = v.size(3);
  const Strides sq(q), sv(v), so(out);
  const T* qp = q.data_ptr<T>();
  const T* kp = kt.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const int64_t bs[4] = {bias.defined() ? bias.stride(0) : 0, bias.defined() ? bias.stride(1) : 0,
                         bias.defined() ? bias.stride(2) : 0, bias.defined() ? bias.stride(3) : 0};
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  const int64_t q_blocks = (Lq + kTileQueries - 1) / kTileQueries;
  const int64_t tile_keys = std::min(kTileKeys, Lk);

  at::parallel_for(0, B * H * q_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(static_cast<size_t>(kTileQueries * tile_keys));           // scores, then exponentials
    std::vector<c10::BFloat16> p(kBf16 ? static_cast<size_t>(kTileQueries * tile_keys) : 0);  // bf16 exponentials
    std::vector<float> o(static_cast<size_t>(kTileQueries * Dv));                  // output rows, unnormalised
    std::vector<float> row_m(kTileQueries), row_l(kTileQueries);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (H * q_blocks), h = (task / q_blocks) % H, q0 = (task % q_blocks) * kTileQueries;
      const int64_t nq = std::min(kTileQueries, Lq - q0);
      const T* qt = qp + b * sq.b + h * sq.h + q0 * sq.row;
      // Causal: the block's last query sees keys up to its own position.
      const int64_t keys = causal ? std::min(Lk, q0 + nq) : Lk;
      std::fill(row_m.begin(), row_m.begin() + nq, kMinusInf);
      std::fill(row_l.begin(), row_l.begin() + nq, 0.0f);
      for (int64_t j0 = 0; j0 < keys; j0 += tile_keys) {
        const int64_t nk = std::min(tile_keys, keys - j0);
        const bool first = j0 == 0;
        cpu::gemm(/*transpose_b=*/false, nq, nk, Dh, log2_scale, qt, sq.row, kp + (b * H + h) * Dh * Lk + j0, Lk, 0.0f,
                  s.data(), nk);
        for (int64_t i = 0; i < nq; ++i) {
          float* si = s.data() + i * nk;
          if (bp != nullptr) {
            const float* bi = bp + b * bs[0] + h * bs[1] + (q0 + i) * bs[2] + j0 * bs[3];
            for (int64_t j = 0; j < nk; ++j) si[j] += bi[j * bs[3]] * static_cast<float>(kLog2e);
          }
          if (causal)
            for (int64_t j = std::max<int64_t>(0, q0 + i + 1 - j0); j < nk; ++j) si[j] = kMinusInf;
          const float m_old = row_m[i], m_new = std::max(m_old, row_max(si, nk));
          float* oi = o.data() + i * Dv;
          if (m_new == kMinusInf) {
            // Every score so far is -inf: nothing to add (a row that stays so ends 0 / 0 = NaN).
            std::fill(si, si + nk, 0.0f);
            if constexpr (kBf16) std::fill(p.data() + i * nk, p.data() + (i + 1) * nk, c10::BFloat16(0.0f));
            continue;
          }
          const float sum = exp_row(si, nk, m_new);
          if constexpr (kBf16) to_bf16_row(si, p.data() + i * nk, nk);
          // The rows accumulated so far were weighted against the old maximum.
          const float corr = first ? 0.0f : exp2_nonpositive(m_old - m_new);
          if (!first && corr != 1.0f) scale_row(oi, Dv, corr);
          row_l[i] = row_l[i] * corr + sum;
          row_m[i] = m_new;
        }
        const T* vt = vp + b * sv.b + h * sv.h + j0 * sv.row;
        const float beta = first ? 0.0f : 1.0f;
        if constexpr (kBf16) cpu::gemm(false, nq, Dv, nk, 1.0f, p.data(), nk, vt, sv.row, beta, o.data(), Dv);
        else cpu::gemm(false, nq, Dv, nk, 1.0f, s.data(), nk, vt, sv.row, beta, o.data(), Dv);
      }
      T* ot = op + b * so.b + h * so.h + q0 * so.row;
      for (int64_t i = 0; i < nq; ++i) divide_row_into(o.data() + i * Dv, Dv, row_l[i], ot + i * so.row);
    }
  });
}

}  // namespace

bool keys_transposed(const at::Tensor& k) { return k.dim() == 4 && k.transpose(2, 3).is_contiguous(); }

bool tiled_attention_applies(const at::Tensor& q) {
  return q.device().is_cpu() && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16);
}

void tiled_attention_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                          double scale, const at::Tensor& bias, bool causal) {
  FLUX_CHECK(tiled_attention_applies(q) && k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                 out.scalar_type() == q.scalar_type() && k.device().is_cpu() && v.device().is_cpu() &&
                 out.device().is_cpu(),
             "tiled attention: CPU fp32 or bf16 tensors of one dtype, got q ", q.scalar_type(), ", k ", k.scalar_type(),
             ", v ", v.scalar_type(), ", out ", out.scalar_type());
  check_shape(q, {-1, -1, -1, -1}, "tiled attention q [B, H, Lq, Dh]");
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Dh = q.size(3);
  check_shape(k, {B, H, -1, Dh}, "tiled attention k [B, H, Lk, Dh]");
  const int64_t Lk = k.size(2);
  check_shape(v, {B, H, Lk, -1}, "tiled attention v [B, H, Lk, Dv]");
  check_shape(out, {B, H, Lq, v.size(3)}, "tiled attention out [B, H, Lq, Dv]");
  FLUX_CHECK(Lk > 0, "tiled attention over no keys");
  for (const at::Tensor* t : {&q, &k, &v, &out})
    FLUX_CHECK(t->stride(3) == 1 || t->size(3) == 1 || (t == &k && keys_transposed(k)),
               "tiled attention: a unit last stride, got strides ", shape_string(t->strides()));
  if (q.numel() == 0) return;
  RECORD_FUNCTION("fluxmpi::tiled_attention", std::vector<c10::IValue>());  // named in operator profiles
  at::Tensor b;
  if (bias.defined()) {
    // float before expanding: the expanded view keeps the broadcast (stride 0), no copy of size B*H*Lq*Lk.
    b = bias.to(at::kFloat).expand({B, H, Lq, Lk});
  }
  // Every query block reads all of its head's keys and values. The keys are copied once,
  // transposed to [B, H, Dh, Lk], so that the score GEMM reads them untransposed (3-5 % faster
  // than a transposed operand at width 512; docs/performance.md), unless they are already in that
  // layout (keys_transposed: nothing is copied); values spread over a wider matrix
  // (the models' [B, L, H, Dh] projections seen as [B, H, L, Dh]: rows H * Dh apart) are gathered
  // once into [B, H, L, Dh], so that their tiles lie in one run of memory (10-18 % faster). Same
  // values and GEMM shapes whatever the layout given: the result is the same.
  const int64_t q_blocks = (Lq + kTileQueries - 1) / kTileQueries;
  const at::Tensor kt = k.transpose(2, 3).contiguous();
  const at::Tensor vp = q_blocks > 1 && v.stride(2) != v.size(3) ? v.contiguous() : v;
  const float s = static_cast<float>(scale * kLog2e);
  if (q.scalar_type() == at::kFloat) tiled_kernel<float>(q, kt, vp, out, s, b, causal);
  else tiled_kernel<c10::BFloat16>(q, kt, vp, out, s, b, causal);
}

}  // namespace fluxmpi::nn
