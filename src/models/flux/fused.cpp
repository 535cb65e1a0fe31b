#include "models/flux/fused.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= Dh; i += 8)
        for (int j = 0; j < 8; ++j) {
          const float v = to_float(xr[i + j]);
          part[j] += v * v;
        }
      for (; i < Dh; ++i) {
        const float v = to_float(xr[i]);
        part[0] += v * v;
      }
      const float ss = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(Dh) + eps);
      for (i = 0; i < Dh; ++i) {
        float v = to_float(xr[i]) * inv;
        if (low) v = round_to<T>(v);
        y[i] = round_to<T>(v * to_float(wp[i]));
      }
      // apply_rope: x * cos + rot(x) * sin in float32, rot(x) = (-x1, x0, -x3, x2, ...).
      const float* c = cp + (row0 + n) * Dh;
      const float* s = snp + (row0 + n) * Dh;
      T* o = op + ((b * H + h) * Ntot + row0 + n) * Dh;
      for (i = 0; i + 1 < Dh; i += 2) {
        const float a = y[i], bb = y[i + 1];
        o[i] = from_float<T>(a * c[i] + (-bb) * s[i]);
        o[i + 1] = from_float<T>(bb * c[i + 1] + a * s[i + 1]);
      }
    }
  });
}

}  // namespace

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
        scores.mul_(scale);
        o4.narrow(1, h0, n).copy_(at::bmm(at::softmax(scores, -1), v[b].narrow(0, h0, n)).transpose(0, 1));
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
