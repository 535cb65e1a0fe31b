// Semantics of torch.nn.GroupNorm (and of torch.nn.SiLU after it), as norm.h says.
#include "models/vae/norm.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "models/common/cpu_math.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::vae {
namespace {

std::atomic<bool> nhwc_enabled{false};  // opt-in: see norm.h

// Pixels per task of the statistics pass: a fixed size, so that the partial sums and their order do
// not depend on the thread count.
constexpr int64_t kPixelsPerChunk = 256;

using nn::cpu::from_float;
using nn::cpu::round_to;
using nn::cpu::to_float;

// Per-channel sums of x and x^2 over n pixel rows of C values, in float64.
template <typename T>
inline void channel_sums_body(const T* x, int64_t n, int64_t C, double* sum, double* sq) {
  for (int64_t p = 0; p < n; ++p) {
    const T* row = x + p * C;
    for (int64_t c = 0; c < C; ++c) {
      const double v = to_float(row[c]);
      sum[c] += v;
      sq[c] += v * v;
    }
  }
}
FLUXMPI_VECTOR_CLONES void channel_sums(const float* x, int64_t n, int64_t C, double* sum, double* sq) {
  channel_sums_body(x, n, C, sum, sq);
}
FLUXMPI_VECTOR_CLONES void channel_sums(const c10::BFloat16* x, int64_t n, int64_t C, double* sum, double* sq) {
  channel_sums_body(x, n, C, sum, sq);
}

// y = x * a + d per channel over n pixel rows (rounded to T, as the group norm's output), then
// SiLU of that when asked (rounded to T again, as silu_ on the norm's output).
template <typename T>
inline void affine_rows_body(const T* x, int64_t n, int64_t C, const float* a, const float* d, bool silu, T* y) {
  for (int64_t p = 0; p < n; ++p) {
    const T* in = x + p * C;
    T* out = y + p * C;
    if (silu) {
      for (int64_t c = 0; c < C; ++c) {
        const float v = round_to<T>(to_float(in[c]) * a[c] + d[c]);
        const float e = nn::cpu::exp_nonpositive(-std::fabs(v));  // e^(-|v|) <= 1: never overflows
        out[c] = from_float<T>(v * ((v >= 0.0f ? 1.0f : e) / (1.0f + e)));
      }
    } else {
      for (int64_t c = 0; c < C; ++c) out[c] = from_float<T>(to_float(in[c]) * a[c] + d[c]);
    }
  }
}
FLUXMPI_VECTOR_CLONES void affine_rows(const float* x, int64_t n, int64_t C, const float* a, const float* d, bool silu,
                                       float* y) {
  affine_rows_body(x, n, C, a, d, silu, y);
}
FLUXMPI_VECTOR_CLONES void affine_rows(const c10::BFloat16* x, int64_t n, int64_t C, const float* a, const float* d,
                                       bool silu, c10::BFloat16* y) {
  affine_rows_body(x, n, C, a, d, silu, y);
}

template <typename T>
void group_norm_kernel(const at::Tensor& x, int64_t groups, const at::Tensor& weight, const at::Tensor& bias, double eps,
                       bool silu, at::Tensor& out) {
  const int64_t B = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
  const int64_t per_group = C / groups, chunks = (L + kPixelsPerChunk - 1) / kPixelsPerChunk;
  const T* xp = x.data_ptr<T>();

  // Statistics: per (image, chunk) the per-channel sums, then per image the channels of a group and
  // the chunks, in order.
  std::vector<double> sums(static_cast<size_t>(B * chunks * C) * 2, 0.0);
  at::parallel_for(0, B * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / chunks, p0 = (t % chunks) * kPixelsPerChunk, n = std::min(kPixelsPerChunk, L - p0);
      double* s = sums.data() + 2 * t * C;
      channel_sums(xp + (b * L + p0) * C, n, C, s, s + C);
    }
  });
  const at::Tensor w = weight.to(at::kFloat).contiguous(), bi = bias.to(at::kFloat).contiguous();
  std::vector<float> a(static_cast<size_t>(B * C)), d(static_cast<size_t>(B * C));
  const double count = static_cast<double>(per_group * L);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      double s = 0, q = 0;
      for (int64_t k = 0; k < chunks; ++k) {
        const double* part = sums.data() + 2 * (b * chunks + k) * C;
        for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
          s += part[c];
          q += part[C + c];
        }
      }
      const double mean = s / count, var = std::max(0.0, q / count - mean * mean);
      const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps)), meanf = static_cast<float>(mean);
      for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
        a[b * C + c] = rstd * w.data_ptr<float>()[c];
        d[b * C + c] = bi.data_ptr<float>()[c] - meanf * a[b * C + c];
      }
    }

  T* yp = out.data_ptr<T>();
  at::parallel_for(0, B * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / chunks, p0 = (t % chunks) * kPixelsPerChunk, n = std::min(kPixelsPerChunk, L - p0);
      affine_rows(xp + (b * L + p0) * C, n, C, a.data() + b * C, d.data() + b * C, silu, yp + (b * L + p0) * C);
    }
  });
}

}  // namespace

bool group_norm_nhwc_applies(const at::Tensor& x) {
  return nhwc_enabled && x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && x.dim() == 4 &&
         x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous();
}

at::Tensor group_norm_nhwc(const at::Tensor& x, int64_t groups, const at::Tensor& weight, const at::Tensor& bias,
                           double eps, bool silu) {
  RECORD_FUNCTION(silu ? "fluxmpi::group_norm_silu" : "fluxmpi::group_norm", std::vector<c10::IValue>());
  FLUX_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) && x.dim() == 4 &&
                 x.is_contiguous(at::MemoryFormat::ChannelsLast),
             "group_norm_nhwc: a channels-last CPU fp32 or bf16 [B, C, H, W], got ", x.scalar_type(), " ",
             nn::shape_string(x.sizes()));
  const int64_t C = x.size(1);
  FLUX_CHECK(groups >= 1 && C % groups == 0, "group_norm_nhwc: ", C, " channels in ", groups, " groups");
  nn::check_shape(weight, {C}, "group norm weight [C]");
  nn::check_shape(bias, {C}, "group norm bias [C]");
  at::Tensor out = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  if (x.scalar_type() == at::kFloat) group_norm_kernel<float>(x, groups, weight, bias, eps, silu, out);
  else group_norm_kernel<c10::BFloat16>(x, groups, weight, bias, eps, silu, out);
  return out;
}

void set_group_norm_nhwc(bool on) { nhwc_enabled = on; }

at::Tensor group_norm(const nn::GroupNorm& norm, const at::Tensor& x) {
  if (group_norm_nhwc_applies(x)) return group_norm_nhwc(x, norm->groups, norm->weight, norm->bias, norm->eps, false);
#if TORCH_VERSION_MAJOR < 2
  if (x.scalar_type() == at::kBFloat16 && x.device().is_cpu() && !x.is_contiguous() &&
      x.is_contiguous(at::MemoryFormat::ChannelsLast))
    return at::group_norm(x.to(at::kFloat), norm->groups, norm->weight.to(at::kFloat), norm->bias.to(at::kFloat),
                          norm->eps)
        .to(at::kBFloat16);
#endif
  return norm->forward(x);
}

at::Tensor group_norm_silu(const nn::GroupNorm& norm, const at::Tensor& x) {
  if (group_norm_nhwc_applies(x)) return group_norm_nhwc(x, norm->groups, norm->weight, norm->bias, norm->eps, true);
  at::Tensor h = group_norm(norm, x);
  return at::silu_(h);
}

}  // namespace fluxmpi::vae
