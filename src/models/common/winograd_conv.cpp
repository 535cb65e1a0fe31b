#include "models/common/winograd_conv.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <vector>

#include "core/error.h"
#include "models/common/cpu_gemm.h"
#include "models/common/cpu_math.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::nn {
namespace {

using cpu::from_float;
using cpu::to_float;

std::atomic<bool> enabled{false};  // opt-in: see winograd_conv.h

constexpr int kAlpha = 4;                      // the transformed tile's side: m + r - 1 = 4 for both
constexpr int kPositions = kAlpha * kAlpha;    // one GEMM each
constexpr int64_t kMinChannels = 16;
// A chunk's transformed inputs and products, [16, tiles, C] and [16, tiles, K] floats, are kept near
// this size: small enough to stay in the cache between the transforms and the GEMMs, large enough
// that each GEMM has a few hundred rows (the GEMM repacks U at every call).
constexpr int64_t kChunkBytes = int64_t{6} << 20;

// The transforms with the points 0, 1, -1, infinity:
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 -1 0 1]
//   G (3x3 kernel) = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],  A^T (2 outputs) = [1 1 1 0; 0 1 -1 1]
//   G (2x2 kernel) = [1 0; 1/2 1/2; 1/2 -1/2; 0 1],  A^T (3 outputs) = [1 1 1 0; 0 1 -1 0; 0 1 1 1]
// (y = A^T [(G g) . (B^T d)] for a 1-D correlation y_i = sum_u d_{i+u} g_u; in 2-D both sides.)

// V = B^T d B for one tile, for every channel: d holds the 16 input rows of the 4 x 4 window (row
// major; each C values, a row of zeros outside the image), V's positions are `stride` apart. In fp32,
// the result rounded to T (bf16: the GEMMs' operand type).
template <typename T>
inline void input_transform_body(const T* const* d, int64_t C, T* V, int64_t stride) {
#pragma GCC ivdep
  for (int64_t c = 0; c < C; ++c) {
    float t[kAlpha][kAlpha];
    for (int j = 0; j < kAlpha; ++j) {
      const float d0 = to_float(d[j][c]), d1 = to_float(d[4 + j][c]), d2 = to_float(d[8 + j][c]),
                  d3 = to_float(d[12 + j][c]);
      t[0][j] = d0 - d2;
      t[1][j] = d1 + d2;
      t[2][j] = d2 - d1;
      t[3][j] = d3 - d1;
    }
    for (int i = 0; i < kAlpha; ++i) {
      V[(4 * i + 0) * stride + c] = from_float<T>(t[i][0] - t[i][2]);
      V[(4 * i + 1) * stride + c] = from_float<T>(t[i][1] + t[i][2]);
      V[(4 * i + 2) * stride + c] = from_float<T>(t[i][2] - t[i][1]);
      V[(4 * i + 3) * stride + c] = from_float<T>(t[i][3] - t[i][1]);
    }
  }
}
FLUXMPI_VECTOR_CLONES void input_transform(const float* const* d, int64_t C, float* V, int64_t stride) {
  input_transform_body(d, C, V, stride);
}
FLUXMPI_VECTOR_CLONES void input_transform(const c10::BFloat16* const* d, int64_t C, c10::BFloat16* V, int64_t stride) {
  input_transform_body(d, C, V, stride);
}

// y = A^T M A + bias for one tile of m x m outputs, every output channel, in fp32 rounded to T: M's
// positions are `stride` apart, y holds the m * m output rows (row major; K values each, a scratch
// row where the tile leaves the image).
template <typename T>
inline void output_transform2_body(const float* M, int64_t stride, int64_t K, const float* bias, T* const* y) {
#pragma GCC ivdep
  for (int64_t k = 0; k < K; ++k) {
    float z[2][kAlpha];
    for (int l = 0; l < kAlpha; ++l) {
      const float m0 = M[l * stride + k], m1 = M[(4 + l) * stride + k], m2 = M[(8 + l) * stride + k],
                  m3 = M[(12 + l) * stride + k];
      z[0][l] = (m0 + m1) + m2;
      z[1][l] = (m1 - m2) + m3;
    }
    for (int p = 0; p < 2; ++p) {
      y[2 * p + 0][k] = from_float<T>(((z[p][0] + z[p][1]) + z[p][2]) + bias[k]);
      y[2 * p + 1][k] = from_float<T>(((z[p][1] - z[p][2]) + z[p][3]) + bias[k]);
    }
  }
}

template <typename T>
inline void output_transform3_body(const float* M, int64_t stride, int64_t K, const float* bias, T* const* y) {
#pragma GCC ivdep
  for (int64_t k = 0; k < K; ++k) {
    float z[3][kAlpha];
    for (int l = 0; l < kAlpha; ++l) {
      const float m0 = M[l * stride + k], m1 = M[(4 + l) * stride + k], m2 = M[(8 + l) * stride + k],
                  m3 = M[(12 + l) * stride + k];
      z[0][l] = (m0 + m1) + m2;
      z[1][l] = m1 - m2;
      z[2][l] = (m1 + m2) + m3;
    }
    for (int p = 0; p < 3; ++p) {
      y[3 * p + 0][k] = from_float<T>(((z[p][0] + z[p][1]) + z[p][2]) + bias[k]);
      y[3 * p + 1][k] = from_float<T>((z[p][1] - z[p][2]) + bias[k]);
      y[3 * p + 2][k] = from_float<T>(((z[p][1] + z[p][2]) + z[p][3]) + bias[k]);
    }
  }
}
FLUXMPI_VECTOR_CLONES void output_transform2(const float* M, int64_t stride, int64_t K, const float* bias, float* const* y) {
  output_transform2_body(M, stride, K, bias, y);
}
FLUXMPI_VECTOR_CLONES void output_transform2(const float* M, int64_t stride, int64_t K, const float* bias,
                                             c10::BFloat16* const* y) {
  output_transform2_body(M, stride, K, bias, y);
}
FLUXMPI_VECTOR_CLONES void output_transform3(const float* M, int64_t stride, int64_t K, const float* bias, float* const* y) {
  output_transform3_body(M, stride, K, bias, y);
}
FLUXMPI_VECTOR_CLONES void output_transform3(const float* M, int64_t stride, int64_t K, const float* bias,
                                             c10::BFloat16* const* y) {
  output_transform3_body(M, stride, K, bias, y);
}

// The transform of a kernel's rows (or columns) as a 4 x 3 matrix: G for a 3x3 kernel; G P_a for
// the upsampler's phase a, whose 2x2 kernel P_a w sums the 3x3 kernel's taps (see
// winograd_upsample2x). Entries 0, +-1, +-1/2.
using RowTransform = std::array<std::array<float, 3>, kAlpha>;
constexpr RowTransform kG3 = {{{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}}};
// The doubled image repeats each input row: an even output row's 3x3 window covers input rows i-1
// (tap 0) and i (taps 1 + 2), an odd one rows i (taps 0 + 1) and i+1 (tap 2): P_0 = [1 0 0; 0 1 1],
// P_1 = [1 1 0; 0 0 1], and with the 2-tap G = [1 0; 1/2 1/2; 1/2 -1/2; 0 1]:
constexpr RowTransform kGP[2] = {{{{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, -0.5f}, {0, 1, 1}}},
                                 {{{1, 1, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, -0.5f}, {0, 0, 1}}}};

constexpr int kLanes = 16;  // output channels transformed together (one AVX-512 vector)

// The 16 positions of the transformed kernels of 16 output channels of one input channel:
// g[16 t + j] = tap t (3u + v) of channel j; out[16 pos + j] = sum over t of coef[9 pos + t] g[16 t + j],
// in the order of t (zero coefficients add exact zeros).
FLUXMPI_VECTOR_CLONES void transform_lanes(const float* __restrict__ g, const float* __restrict__ coef,
                                           float* __restrict__ out) {
  for (int pos = 0; pos < kPositions; ++pos) {
    const float* c = coef + 9 * pos;
    for (int j = 0; j < kLanes; ++j) {
      float acc = c[0] * g[j];
      for (int t = 1; t < 9; ++t) acc += c[t] * g[kLanes * t + j];
      out[kLanes * pos + j] = acc;
    }
  }
}

// U = R g Q^T of every kernel g = w[k, c] ([K, C, 3, 3]) as the GEMMs read it: [16, C, K], position
// (i, l) = R[i] g Q[l]^T = sum over taps (u, v) of R[i][u] Q[l][v] g[u][v]; the coefficients are
// products of 0, +-1 and +-1/2, exact. Output channels go 16 at a time, each of their rows of w read
// in order. Computed in fp32 (from bf16 weights exactly), returned in `dtype`.
at::Tensor transformed_kernels(const at::Tensor& weight, const RowTransform& R, const RowTransform& Q,
                               at::ScalarType dtype) {
  const int64_t K = weight.size(0), C = weight.size(1);
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  at::Tensor U = at::empty({kPositions, C, K}, w.options());
  float coef[kPositions * 9];
  for (int i = 0; i < kAlpha; ++i)
    for (int l = 0; l < kAlpha; ++l)
      for (int u = 0; u < 3; ++u)
        for (int v = 0; v < 3; ++v) coef[9 * (kAlpha * i + l) + 3 * u + v] = R[i][u] * Q[l][v];
  const float* wp = w.data_ptr<float>();
  float* up = U.data_ptr<float>();
  at::parallel_for(0, (K + kLanes - 1) / kLanes, 1, [&](int64_t begin, int64_t end) {
    float g[9 * kLanes] = {}, out[kPositions * kLanes];
    for (int64_t block = begin; block < end; ++block) {
      const int64_t k0 = block * kLanes, kn = std::min<int64_t>(kLanes, K - k0);
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t j = 0; j < kn; ++j)
          for (int t = 0; t < 9; ++t) g[kLanes * t + j] = wp[((k0 + j) * C + c) * 9 + t];
        transform_lanes(g, coef, out);
        for (int pos = 0; pos < kPositions; ++pos)
          std::copy(out + kLanes * pos, out + kLanes * pos + kn, up + (pos * C + c) * K + k0);
      }
    }
  });
  return U.to(dtype);
}

// One convolution of the tiles: output (n, p, q), p < Ho, q < Wo, reads the 4 x 4 window of x
// from (p + oy, q + ox) (tile origins m apart) and is written at out + n ob + p op + q oq.
template <typename T>
struct Convolution {
  int m = 2;
  int64_t oy = -1, ox = -1;
  int64_t Ho = 0, Wo = 0;
  const T* U = nullptr;  // [16, C, K]
  T* out = nullptr;
  int64_t ob = 0, op = 0, oq = 0;
};

// x: [B, H, W, C] contiguous (a channels-last tensor's memory) of T; the products in fp32.
template <typename T>
void run(const at::Tensor& x, int64_t K, const float* bias, const Convolution<T>& conv) {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int m = conv.m;
  const int64_t tiles_y = (conv.Ho + m - 1) / m, tiles_x = (conv.Wo + m - 1) / m, tiles = B * tiles_y * tiles_x;
  const int64_t per_chunk =
      std::clamp<int64_t>(kChunkBytes / (kPositions * (static_cast<int64_t>(sizeof(T)) * C + 4 * K)) / 16 * 16, 16, 512);
  const int64_t chunks = (tiles + per_chunk - 1) / per_chunk;
  const T* xp = x.data_ptr<T>();
  const std::vector<T> zeros(static_cast<size_t>(C), T(0.0f));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> V(static_cast<size_t>(kPositions * per_chunk * C)), discard(static_cast<size_t>(K));
    std::vector<float> M(static_cast<size_t>(kPositions * per_chunk * K));
    const T* window[kPositions];
    T* outputs[9];
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t t0 = chunk * per_chunk, n_tiles = std::min(per_chunk, tiles - t0);
      for (int64_t t = 0; t < n_tiles; ++t) {
        const int64_t tile = t0 + t, n = tile / (tiles_y * tiles_x), ty = (tile / tiles_x) % tiles_y, tx = tile % tiles_x;
        const int64_t y0 = ty * m + conv.oy, x0 = tx * m + conv.ox;
        for (int i = 0; i < kAlpha; ++i)
          for (int j = 0; j < kAlpha; ++j) {
            const int64_t yy = y0 + i, xx = x0 + j;
            window[kAlpha * i + j] =
                yy >= 0 && yy < H && xx >= 0 && xx < W ? xp + ((n * H + yy) * W + xx) * C : zeros.data();
          }
        input_transform(window, C, V.data() + t * C, per_chunk * C);
      }
      for (int pos = 0; pos < kPositions; ++pos)
        cpu::gemm(false, n_tiles, K, C, 1.0f, V.data() + pos * per_chunk * C, C, conv.U + pos * C * K, K, 0.0f,
                  M.data() + pos * per_chunk * K, K);
      for (int64_t t = 0; t < n_tiles; ++t) {
        const int64_t tile = t0 + t, n = tile / (tiles_y * tiles_x), ty = (tile / tiles_x) % tiles_y, tx = tile % tiles_x;
        for (int p = 0; p < m; ++p)
          for (int q = 0; q < m; ++q) {
            const int64_t yy = ty * m + p, xx = tx * m + q;
            outputs[m * p + q] =
                yy < conv.Ho && xx < conv.Wo ? conv.out + n * conv.ob + yy * conv.op + xx * conv.oq : discard.data();
          }
        if (m == 2) output_transform2(M.data() + t * K, per_chunk * K, K, bias, outputs);
        else output_transform3(M.data() + t * K, per_chunk * K, K, bias, outputs);
      }
    }
  });
}

std::vector<float> bias_of(const at::Tensor& bias, int64_t K) {
  std::vector<float> b(static_cast<size_t>(K), 0.0f);
  if (bias.defined()) {
    const at::Tensor f = bias.to(at::kFloat).contiguous();
    std::copy(f.data_ptr<float>(), f.data_ptr<float>() + K, b.begin());
  }
  return b;
}

void check_input(const at::Tensor& x, const at::Tensor& weight, int64_t kernel, const at::Tensor& bias, int64_t K) {
  FLUX_CHECK(winograd_applies(x, weight), "winograd conv: needs CPU fp32 or bf16 input [B, C, H, W] with >= ",
             kMinChannels, " channels and a oneDNN GEMM of its dtype, got ", x.scalar_type(), " ", shape_string(x.sizes()));
  check_shape(weight, {-1, x.size(1), kernel, kernel}, "winograd conv weight");
  FLUX_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == K), "winograd conv: bias of ", K, " channels, got ",
             shape_string(bias.sizes()));
}

template <typename T>
void conv3x3(const at::Tensor& x, const at::Tensor& weight, const float* bias, at::Tensor& out) {
  const int64_t H = x.size(2), W = x.size(3), K = weight.size(0);
  const at::Tensor U = transformed_kernels(weight, kG3, kG3, x.scalar_type());
  Convolution<T> conv;
  conv.m = 2;
  conv.Ho = H;
  conv.Wo = W;
  conv.U = U.data_ptr<T>();
  conv.out = out.data_ptr<T>();
  conv.ob = H * W * K;
  conv.op = W * K;
  conv.oq = K;
  run(x, K, bias, conv);
}

template <typename T>
void upsample2x(const at::Tensor& x, const at::Tensor& weight, const float* bias, at::Tensor& out) {
  const int64_t H = x.size(2), W = x.size(3), K = weight.size(0);
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      const at::Tensor U = transformed_kernels(weight, kGP[a], kGP[b], x.scalar_type());
      Convolution<T> conv;
      conv.m = 3;
      conv.oy = a - 1;
      conv.ox = b - 1;
      conv.Ho = H;
      conv.Wo = W;
      conv.U = U.data_ptr<T>();
      conv.out = out.data_ptr<T>() + (a * 2 * W + b) * K;
      conv.ob = 4 * H * W * K;
      conv.op = 4 * W * K;
      conv.oq = 2 * K;
      run(x, K, bias, conv);
    }
}

}  // namespace

bool winograd_applies(const at::Tensor& x, const at::Tensor& weight) {
  const bool gemm = x.scalar_type() == at::kFloat    ? cpu::gemm_provider_f32() == cpu::GemmProvider::OneDnn
                    : x.scalar_type() == at::kBFloat16 ? cpu::gemm_provider_bf16() == cpu::GemmProvider::OneDnn
                                                       : false;
  return enabled && gemm && x.device().is_cpu() && x.dim() == 4 && weight.dim() == 4 && x.size(1) >= kMinChannels &&
         weight.size(0) >= kMinChannels;
}

at::Tensor winograd_conv3x3(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  RECORD_FUNCTION("fluxmpi::winograd_conv3x3", std::vector<c10::IValue>());  // named in operator profiles
  const int64_t B = x.size(0), H = x.size(2), W = x.size(3), K = weight.size(0);
  check_input(x, weight, 3, bias, K);
  const at::Tensor xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  const std::vector<float> b = bias_of(bias, K);
  at::Tensor out = at::empty({B, K, H, W}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (x.scalar_type() == at::kFloat) conv3x3<float>(xc, weight, b.data(), out);
  else conv3x3<c10::BFloat16>(xc, weight, b.data(), out);
  return x.is_contiguous(at::MemoryFormat::ChannelsLast) ? out : out.contiguous();
}

at::Tensor winograd_upsample2x(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  RECORD_FUNCTION("fluxmpi::winograd_upsample2x", std::vector<c10::IValue>());  // named in operator profiles
  const int64_t B = x.size(0), H = x.size(2), W = x.size(3), K = weight.size(0);
  check_input(x, weight, 3, bias, K);
  const at::Tensor xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  const std::vector<float> b = bias_of(bias, K);
  at::Tensor out = at::empty({B, K, 2 * H, 2 * W}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (x.scalar_type() == at::kFloat) upsample2x<float>(xc, weight, b.data(), out);
  else upsample2x<c10::BFloat16>(xc, weight, b.data(), out);
  return x.is_contiguous(at::MemoryFormat::ChannelsLast) ? out : out.contiguous();
}

void set_winograd(bool on) { enabled = on; }
bool winograd_enabled() { return enabled; }

}  // namespace fluxmpi::nn
