#include "models/flux/fused.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "models/common/attention.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::flux::fused {
namespace {

// bf16 <-> float as c10::BFloat16 does it (round to nearest even, NaN kept quiet), written on the
// bits so that the compiler can vectorise the loops.
inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) { return f; }
template <>
inline c10::BFloat16 from_float<c10::BFloat16>(float f) { return c10::BFloat16(f); }
// The value a tensor of T holds after storing f (identity for float).
template <typename T>
inline float round_to(float f) { return to_float(from_float<T>(f)); }

// term(0) + ... + term(n - 1) in 8 interleaved partial sums, combined pairwise: one fixed order,
// and a loop the compiler vectorises.
template <typename Term>
inline float sum8(int64_t n, Term term) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += term(i + j);
  for (; i < n; ++i) part[0] += term(i);
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

constexpr int64_t kMaxHeadDim = 1024;

template <typename T>
void rms_norm_rope_kernel(const at::Tensor& x, const at::Tensor& weight, float eps, const RopeTables& rope, int64_t row0,
                          at::Tensor& out) {
  const int64_t B = x.size(0), N = x.size(1), H = x.size(2), Dh = x.size(3), Ntot = out.size(2);
  const int64_t sb = x.stride(0), sn = x.stride(1), sh = x.stride(2);
  const T* xp = x.data_ptr<T>();
  const T* wp = weight.data_ptr<T>();
  const float* cp = rope.cos.data_ptr<float>();
  const float* snp = rope.sin.data_ptr<float>();
  T* op = out.data_ptr<T>();
  // RMSNormImpl: y = x * rsqrt(mean(x^2) + eps), cast to a 16-bit weight's dtype, times weight.
  constexpr bool low = !std::is_same_v<T, float>;
  at::parallel_for(0, B * N * H, 16, [&](int64_t begin, int64_t end) {
    float y[kMaxHeadDim];
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (N * H), n = (r / H) % N, h = r % H;
      const T* xr = xp + b * sb + n * sn + h * sh;
      const float ss = sum8(Dh, [&](int64_t i) {
        const float v = to_float(xr[i]);
        return v * v;
      });
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(Dh) + eps);
      for (int64_t i = 0; i < Dh; ++i) {
        float v = to_float(xr[i]) * inv;
        if (low) v = round_to<T>(v);
        y[i] = round_to<T>(v * to_float(wp[i]));
      }
      // apply_rope: x * cos + rot(x) * sin in float32, rot(x) = (-x1, x0, -x3, x2, ...).
      const float* c = cp + (row0 + n) * Dh;
      const float* s = snp + (row0 + n) * Dh;
      T* o = op + ((b * H + h) * Ntot + row0 + n) * Dh;
      for (int64_t i = 0; i + 1 < Dh; i += 2) {
        const float a = y[i], bb = y[i + 1];
        o[i] = from_float<T>(a * c[i] + (-bb) * s[i]);
        o[i + 1] = from_float<T>(bb * c[i + 1] + a * s[i + 1]);
      }
    }
  });
}

// The bits of a float and back (defined behaviour, and vectorised by the compiler).
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// e^x for x <= 0 in plain float arithmetic (no libm call, so that a loop of it vectorises):
// x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series to r^7 (truncation < 6e-9
// relative), times 2^n written into the exponent bits. Below -87 (e^-87 ~ 1.6e-38, near the
// smallest normal float) the result is 0, as libtorch's softmax gives there.
inline float exp_nonpositive(float x_in) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float x = x_in < -87.0f ? -87.0f : x_in;
  const float shifted = x * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const int32_t ni = static_cast<int32_t>(float_bits(shifted) - float_bits(kRound));  // n as an integer
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;  // ln2 in two parts
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float e = p * bits_float(static_cast<uint32_t>(ni + 127) << 23);
  return x_in < -87.0f ? 0.0f : e;
}

}  // namespace

// The loops of softmax_scaled_ and gelu_tanh_into, compiled also for AVX2 and AVX-512 and
// picked by the CPU at load time (GCC's target_clones): 8 and 16 floats a vector where the
// baseline x86-64 build has 4. Without contraction (ISO C++ mode) every clone computes the same
// values.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FLUXMPI_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FLUXMPI_VECTOR_CLONES
#endif

namespace {

FLUXMPI_VECTOR_CLONES void softmax_row(c10::BFloat16* row, float* e, int64_t N, float sc) {
  // The row's maximum in 8 interleaved parts (a loop the compiler vectorises).
  float part[8];
  for (int j = 0; j < 8; ++j) part[j] = to_float(row[0]);
  int64_t i = 0;
  for (; i + 8 <= N; i += 8)
    for (int j = 0; j < 8; ++j) part[j] = part[j] < to_float(row[i + j]) ? to_float(row[i + j]) : part[j];
  for (; i < N; ++i) part[0] = part[0] < to_float(row[i]) ? to_float(row[i]) : part[0];
  float m = part[0];
  for (int j = 1; j < 8; ++j) m = m < part[j] ? part[j] : m;
  for (i = 0; i < N; ++i) e[i] = exp_nonpositive((to_float(row[i]) - m) * sc);
  const float inv = 1.0f / sum8(N, [&](int64_t j) { return e[j]; });
  for (i = 0; i < N; ++i) row[i] = c10::BFloat16(e[i] * inv);
}

// 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); sigmoid from e^(-2|u|),
// which never cancels: 1 / (1 + e) for u >= 0, e / (1 + e) below.
FLUXMPI_VECTOR_CLONES void gelu_tanh_row(const c10::BFloat16* x, c10::BFloat16* o, int64_t C) {
  constexpr float kBeta = 0.79788456080286535588f, kKappa = 0.044715f;
  for (int64_t i = 0; i < C; ++i) {
    const float v = to_float(x[i]);
    const float u = kBeta * (v + kKappa * v * v * v);
    const float e = exp_nonpositive(-2.0f * std::fabs(u));
    o[i] = c10::BFloat16(v * ((u >= 0.0f ? 1.0f : e) / (1.0f + e)));
  }
}

}  // namespace

void softmax_scaled_(at::Tensor& x, double scale) {
  FLUX_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.dim() >= 1 && scale > 0,
             "softmax_scaled_: a contiguous CPU bf16 tensor and a positive scale, got ", x.scalar_type());
  const int64_t N = x.size(-1), rows = N == 0 ? 0 : x.numel() / N;
  const float sc = static_cast<float>(scale);
  c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e(static_cast<size_t>(N));
    for (int64_t r = begin; r < end; ++r) softmax_row(xp + r * N, e.data(), N, sc);
  });
}

void gelu_tanh_into(const at::Tensor& x, at::Tensor& out) {
  FLUX_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16 &&
                 x.dim() == 3 && x.sizes() == out.sizes() && x.stride(2) == 1 && out.stride(2) == 1,
             "gelu_tanh_into: CPU bf16 x and out [B, N, C] with unit last strides, got ", x.scalar_type(), " ",
             x.sizes(), " and ", out.scalar_type(), " ", out.sizes());
  const int64_t N = x.size(1), C = x.size(2);
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, x.size(0) * N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      gelu_tanh_row(xp + (r / N) * x.stride(0) + (r % N) * x.stride(1), op + (r / N) * out.stride(0) + (r % N) * out.stride(1), C);
  });
}

at::Tensor layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  FLUX_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 3 && x.is_contiguous() &&
                 shift.scalar_type() == at::kBFloat16 && scale.scalar_type() == at::kBFloat16,
             "layer_norm_modulate: a contiguous CPU bf16 x [B, L, D] and bf16 shift, scale, got ", x.scalar_type(), ", ",
             shift.scalar_type(), ", ", scale.scalar_type());
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  nn::check_shape(shift, {B, D}, "layer_norm_modulate shift [B, D]");
  nn::check_shape(scale, {B, D}, "layer_norm_modulate scale [B, D]");
  FLUX_CHECK(shift.stride(1) == 1 && scale.stride(1) == 1, "layer_norm_modulate: shift and scale need a unit last stride");
  // As the operators: 1 + scale is a bf16 tensor, layer_norm's output is rounded to bf16, and
  // addcmul(shift, normed, 1 + scale) computes in float and rounds once.
  std::vector<float> sh(static_cast<size_t>(B * D)), one_plus(static_cast<size_t>(B * D));
  const c10::BFloat16* shp = shift.data_ptr<c10::BFloat16>();
  const c10::BFloat16* scp = scale.data_ptr<c10::BFloat16>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < D; ++i) {
      sh[b * D + i] = to_float(shp[b * shift.stride(0) + i]);
      one_plus[b * D + i] = round_to<c10::BFloat16>(1.0f + to_float(scp[b * scale.stride(0) + i]));
    }
  at::Tensor out = at::empty_like(x);
  const c10::BFloat16* xp = x.data_ptr<c10::BFloat16>();
  c10::BFloat16* op = out.data_ptr<c10::BFloat16>();
  const float epsf = static_cast<float>(eps), invD = 1.0f / static_cast<float>(D);
  at::parallel_for(0, B * L, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> v(static_cast<size_t>(D));
    for (int64_t r = begin; r < end; ++r) {
      const c10::BFloat16* xr = xp + r * D;
      for (int64_t i = 0; i < D; ++i) v[i] = to_float(xr[i]);
      const float mean = sum8(D, [&](int64_t i) { return v[i]; }) * invD;
      for (int64_t i = 0; i < D; ++i) v[i] -= mean;
      const float var = sum8(D, [&](int64_t i) { return v[i] * v[i]; }) * invD;
      // libtorch's form of the normalisation: x * rstd + (-rstd * mean).
      const float rstd = 1.0f / std::sqrt(var + epsf), bias = -rstd * mean;
      const float* s = sh.data() + (r / L) * D;
      const float* t = one_plus.data() + (r / L) * D;
      c10::BFloat16* o = op + r * D;
      for (int64_t i = 0; i < D; ++i)
        o[i] = c10::BFloat16(s[i] + round_to<c10::BFloat16>(to_float(xr[i]) * rstd + bias) * t[i]);
    }
  });
  return out;
}

bool applies(const at::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

void rms_norm_rope_into(const at::Tensor& x, const at::Tensor& weight, double eps, const RopeTables& rope, int64_t row0,
                        at::Tensor& out) {
  FLUX_CHECK(applies(x) && x.scalar_type() == out.scalar_type() && x.scalar_type() == weight.scalar_type(),
             "rms_norm_rope_into: CPU fp32/bf16 tensors of one dtype, got ", x.scalar_type(), ", ", weight.scalar_type(), ", ",
             out.scalar_type());
  nn::check_shape(x, {-1, -1, -1, -1}, "rms_norm_rope_into x [B, N, H, Dh]");
  const int64_t B = x.size(0), N = x.size(1), H = x.size(2), Dh = x.size(3);
  nn::check_shape(out, {B, H, -1, Dh}, "rms_norm_rope_into out [B, H, Ntot, Dh]");
  nn::check_shape(weight, {Dh}, "rms_norm_rope_into weight [Dh]");
  FLUX_CHECK(out.is_contiguous() && weight.is_contiguous() && x.stride(3) == 1 && Dh % 2 == 0 && Dh <= kMaxHeadDim,
             "rms_norm_rope_into: layouts");
  FLUX_CHECK(row0 >= 0 && row0 + N <= out.size(2) && rope.cos.size(0) == out.size(2) && rope.cos.size(1) == Dh &&
                 rope.cos.is_contiguous() && rope.sin.is_contiguous() && rope.cos.scalar_type() == at::kFloat,
             "rms_norm_rope_into: rows ", row0, "+", N, " of ", out.size(2), ", rope tables ", nn::shape_string(rope.cos.sizes()));
  const float eps_f = static_cast<float>(eps);  // `variance + eps` adds eps to a float32 tensor
  if (x.scalar_type() == at::kFloat) rms_norm_rope_kernel<float>(x, weight, eps_f, rope, row0, out);
  else rms_norm_rope_kernel<c10::BFloat16>(x, weight, eps_f, rope, row0, out);
}

void attention_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), Dh = q.size(3);
  nn::check_shape(k, {B, H, N, Dh}, "attention_into k");
  nn::check_shape(v, {B, H, N, Dh}, "attention_into v");
  nn::check_shape(out, {B, N, H * Dh}, "attention_into out [B, N, H*Dh]");
  FLUX_CHECK(q.is_contiguous() && k.is_contiguous() && out.stride(2) == 1, "attention_into: layouts");
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  if (q.scalar_type() == at::kBFloat16) {
    // bf16: libtorch's batched matmuls (oneDNN) are several times faster than one head at a time
    // here (measured at Dh 64 and 128); chunks of heads keep the scores under
    // nn::kAttentionChunkBytes, as nn::attention does.
    const int64_t per_head = N * N * static_cast<int64_t>(q.element_size());
    const int64_t chunk = std::max<int64_t>(1, nn::kAttentionChunkBytes / std::max<int64_t>(per_head, 1));
    for (int64_t b = 0; b < B; ++b) {
      at::Tensor o4 = out[b].view({N, H, Dh});
      for (int64_t h0 = 0; h0 < H; h0 += chunk) {
        const int64_t n = std::min(chunk, H - h0);
        at::Tensor scores = at::bmm(q[b].narrow(0, h0, n), k[b].narrow(0, h0, n).transpose(1, 2));
        softmax_scaled_(scores, scale);  // the scale inside: no bf16 rounding of the scaled scores
        o4.narrow(1, h0, n).copy_(at::bmm(scores, v[b].narrow(0, h0, n)).transpose(0, 1));
      }
    }
    return;
  }
  // fp32: one head at a time, the scale inside the matmul, the output written in place (faster
  // than the batched matmuls with OpenBLAS, and one [N, N] score buffer instead of many).
  at::Tensor scores = at::empty({N, N}, q.options());
  at::Tensor probs = at::empty({N, N}, q.options());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      at::addmm_out(scores, scores, q[b][h], k[b][h].t(), /*beta=*/0, /*alpha=*/scale);
      at::_softmax_out(probs, scores, -1, /*half_to_float=*/false);
      at::Tensor o = out[b].narrow(1, h * Dh, Dh);
      at::mm_out(o, probs, v[b][h]);
    }
  }
}

}  // namespace fluxmpi::flux::fused
