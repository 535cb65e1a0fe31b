#include "models/flux/fused.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "models/common/cpu_math.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::flux::fused {
namespace {

using nn::cpu::exp_nonpositive;
using nn::cpu::from_float;
using nn::cpu::round_to;
using nn::cpu::sum8;
using nn::cpu::to_float;

constexpr int64_t kMaxHeadDim = 1024;

template <typename T>
void rms_norm_rope_kernel(const at::Tensor& x, const at::Tensor& weight, float eps, const RopeTables& rope,
                          int64_t rope_row0, const at::Tensor& out) {
  const int64_t B = x.size(0), N = x.size(1), H = x.size(2), Dh = x.size(3);
  const int64_t sb = x.stride(0), sn = x.stride(1), sh = x.stride(2);
  const int64_t ob = out.stride(0), oh = out.stride(1), on = out.stride(2);
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
      const float* c = cp + (rope_row0 + n) * Dh;
      const float* s = snp + (rope_row0 + n) * Dh;
      T* o = op + b * ob + h * oh + n * on;
      for (int64_t i = 0; i + 1 < Dh; i += 2) {
        const float a = y[i], bb = y[i + 1];
        o[i] = from_float<T>(a * c[i] + (-bb) * s[i]);
        o[i + 1] = from_float<T>(bb * c[i + 1] + a * s[i + 1]);
      }
    }
  });
}

}  // namespace

namespace {

// 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); sigmoid from e^(-2|u|),
// which never cancels: 1 / (1 + e) for u >= 0, e / (1 + e) below.
template <typename T>
inline void gelu_tanh_body(const T* x, T* o, int64_t C) {
  constexpr float kBeta = 0.79788456080286535588f, kKappa = 0.044715f;
  for (int64_t i = 0; i < C; ++i) {
    const float v = to_float(x[i]);
    const float u = kBeta * (v + kKappa * v * v * v);
    const float e = exp_nonpositive(-2.0f * std::fabs(u));
    o[i] = from_float<T>(v * ((u >= 0.0f ? 1.0f : e) / (1.0f + e)));
  }
}
FLUXMPI_VECTOR_CLONES void gelu_tanh_row(const c10::BFloat16* x, c10::BFloat16* o, int64_t C) { gelu_tanh_body(x, o, C); }
FLUXMPI_VECTOR_CLONES void gelu_tanh_row(const float* x, float* o, int64_t C) { gelu_tanh_body(x, o, C); }

// One row of layer_norm_modulate: xr [D] -> o [D], with v [D] as scratch; s = shift, t = 1 + scale.
template <typename T>
inline void layer_norm_modulate_body(const T* xr, float* v, int64_t D, float eps, const float* s, const float* t, T* o) {
  const float invD = 1.0f / static_cast<float>(D);
  for (int64_t i = 0; i < D; ++i) v[i] = to_float(xr[i]);
  const float mean = sum8(D, [&](int64_t i) { return v[i]; }) * invD;
  for (int64_t i = 0; i < D; ++i) v[i] -= mean;
  const float var = sum8(D, [&](int64_t i) { return v[i] * v[i]; }) * invD;
  // libtorch's form of the normalisation: x * rstd + (-rstd * mean), rounded to T as its output.
  const float rstd = 1.0f / std::sqrt(var + eps), bias = -rstd * mean;
  for (int64_t i = 0; i < D; ++i) o[i] = from_float<T>(s[i] + round_to<T>(to_float(xr[i]) * rstd + bias) * t[i]);
}
FLUXMPI_VECTOR_CLONES void layer_norm_modulate_row(const c10::BFloat16* xr, float* v, int64_t D, float eps, const float* s,
                                                   const float* t, c10::BFloat16* o) {
  layer_norm_modulate_body(xr, v, D, eps, s, t, o);
}
FLUXMPI_VECTOR_CLONES void layer_norm_modulate_row(const float* xr, float* v, int64_t D, float eps, const float* s,
                                                   const float* t, float* o) {
  layer_norm_modulate_body(xr, v, D, eps, s, t, o);
}

template <typename T>
void gelu_tanh_kernel(const at::Tensor& x, const at::Tensor& out) {
  const int64_t N = x.size(1), C = x.size(2);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, x.size(0) * N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      gelu_tanh_row(xp + (r / N) * x.stride(0) + (r % N) * x.stride(1), op + (r / N) * out.stride(0) + (r % N) * out.stride(1), C);
  });
}

template <typename T>
at::Tensor layer_norm_modulate_kernel(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, float eps) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  // As the operators: 1 + scale is a tensor of T, layer_norm's output is rounded to T, and
  // addcmul(shift, normed, 1 + scale) computes in float and rounds once.
  std::vector<float> sh(static_cast<size_t>(B * D)), one_plus(static_cast<size_t>(B * D));
  const T* shp = shift.data_ptr<T>();
  const T* scp = scale.data_ptr<T>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < D; ++i) {
      sh[b * D + i] = to_float(shp[b * shift.stride(0) + i]);
      one_plus[b * D + i] = round_to<T>(1.0f + to_float(scp[b * scale.stride(0) + i]));
    }
  at::Tensor out = at::empty_like(x);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, B * L, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> v(static_cast<size_t>(D));
    for (int64_t r = begin; r < end; ++r)
      layer_norm_modulate_row(xp + r * D, v.data(), D, eps, sh.data() + (r / L) * D, one_plus.data() + (r / L) * D, op + r * D);
  });
  return out;
}

}  // namespace

void gelu_tanh_into(const at::Tensor& x, const at::Tensor& out) {
  RECORD_FUNCTION("fluxmpi::gelu_tanh", std::vector<c10::IValue>());  // named in operator profiles
  FLUX_CHECK(applies(x) && out.scalar_type() == x.scalar_type() && out.device().is_cpu() && x.dim() == 3 &&
                 x.sizes() == out.sizes() && x.stride(2) == 1 && out.stride(2) == 1,
             "gelu_tanh_into: CPU fp32/bf16 x and out of one dtype, [B, N, C] with unit last strides, got ", x.scalar_type(),
             " ", x.sizes(), " and ", out.scalar_type(), " ", out.sizes());
  if (x.scalar_type() == at::kFloat) gelu_tanh_kernel<float>(x, out);
  else gelu_tanh_kernel<c10::BFloat16>(x, out);
}

at::Tensor layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  RECORD_FUNCTION("fluxmpi::layer_norm_modulate", std::vector<c10::IValue>());  // named in operator profiles
  FLUX_CHECK(applies(x) && x.dim() == 3 && x.is_contiguous() && shift.scalar_type() == x.scalar_type() &&
                 scale.scalar_type() == x.scalar_type() && shift.device().is_cpu() && scale.device().is_cpu(),
             "layer_norm_modulate: a contiguous CPU fp32/bf16 x [B, L, D] and shift, scale of its dtype, got ",
             x.scalar_type(), ", ", shift.scalar_type(), ", ", scale.scalar_type());
  nn::check_shape(shift, {x.size(0), x.size(2)}, "layer_norm_modulate shift [B, D]");
  nn::check_shape(scale, {x.size(0), x.size(2)}, "layer_norm_modulate scale [B, D]");
  FLUX_CHECK(shift.stride(1) == 1 && scale.stride(1) == 1, "layer_norm_modulate: shift and scale need a unit last stride");
  const float epsf = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) return layer_norm_modulate_kernel<float>(x, shift, scale, epsf);
  return layer_norm_modulate_kernel<c10::BFloat16>(x, shift, scale, epsf);
}

bool applies(const at::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

void rms_norm_rope_into(const at::Tensor& x, const at::Tensor& weight, double eps, const RopeTables& rope,
                        int64_t rope_row0, const at::Tensor& out) {
  RECORD_FUNCTION("fluxmpi::rms_norm_rope", std::vector<c10::IValue>());  // named in operator profiles
  FLUX_CHECK(applies(x) && x.scalar_type() == out.scalar_type() && x.scalar_type() == weight.scalar_type(),
             "rms_norm_rope_into: CPU fp32/bf16 tensors of one dtype, got ", x.scalar_type(), ", ", weight.scalar_type(), ", ",
             out.scalar_type());
  nn::check_shape(x, {-1, -1, -1, -1}, "rms_norm_rope_into x [B, N, H, Dh]");
  const int64_t B = x.size(0), N = x.size(1), H = x.size(2), Dh = x.size(3);
  nn::check_shape(out, {B, H, N, Dh}, "rms_norm_rope_into out [B, H, N, Dh]");
  nn::check_shape(weight, {Dh}, "rms_norm_rope_into weight [Dh]");
  FLUX_CHECK(out.stride(3) == 1 && weight.is_contiguous() && x.stride(3) == 1 && Dh % 2 == 0 && Dh <= kMaxHeadDim,
             "rms_norm_rope_into: layouts");
  FLUX_CHECK(rope_row0 >= 0 && rope_row0 + N <= rope.cos.size(0) && rope.cos.size(1) == Dh && rope.cos.is_contiguous() &&
                 rope.sin.is_contiguous() && rope.cos.scalar_type() == at::kFloat,
             "rms_norm_rope_into: rope rows ", rope_row0, "+", N, " of tables ", nn::shape_string(rope.cos.sizes()));
  const float eps_f = static_cast<float>(eps);  // `variance + eps` adds eps to a float32 tensor
  if (x.scalar_type() == at::kFloat) rms_norm_rope_kernel<float>(x, weight, eps_f, rope, rope_row0, out);
  else rms_norm_rope_kernel<c10::BFloat16>(x, weight, eps_f, rope, rope_row0, out);
}

}  // namespace fluxmpi::flux::fused
