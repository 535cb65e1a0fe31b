#include "models/common/cpu_linear.h"

#include <ATen/Parallel.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>

#include "models/common/cpu_gemm.h"
#include "models/common/large_alloc.h"
#include "models/common/layers.h"

namespace fluxmpi::nn {
namespace {

std::atomic<bool> onednn_linear{true};

bool onednn_float(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && cpu::gemm_provider_f32() == cpu::GemmProvider::OneDnn;
}

// [out, in] read as a row-major [in, out] matrix with leading dimension stride(1).
bool in_gemm_layout(const at::Tensor& w) {
  return w.dim() == 2 && (w.stride(0) == 1 || w.size(0) == 1) && w.stride(1) >= w.size(0);
}

// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols: in square tiles, so that both
// sides are read and written a cache line at a time (a weight of 3072 x 12288 floats takes a few
// tens of milliseconds, where an element-wise strided copy takes seconds).
void transpose_into(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  constexpr int64_t kTile = 32;
  at::parallel_for(0, (rows + kTile - 1) / kTile, 1, [&](int64_t begin, int64_t end) {
    for (int64_t rt = begin; rt < end; ++rt) {
      const int64_t r0 = rt * kTile, r1 = std::min(rows, r0 + kTile);
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t c1 = std::min(cols, c0 + kTile);
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
      }
    }
  });
}

// Writes weight `w` ([n, in], any layout) into columns [offset, offset + n) of the row-major
// [in, ld] matrix at `dst`.
void write_transposed(const at::Tensor& w, float* dst, int64_t ld, int64_t offset) {
  const int64_t n = w.size(0), in = w.size(1);
  if (in_gemm_layout(w)) {  // already [in, n] rows in memory: row by row
    at::from_blob(dst + offset, {in, n}, {ld, 1}, w.options()).copy_(w.t());
    return;
  }
  const at::Tensor rows = w.contiguous();
  transpose_into(rows.data_ptr<float>(), n, in, in, dst + offset, ld);
}

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!onednn_linear || !onednn_float(x) || !onednn_float(weight) || !in_gemm_layout(weight) || x.dim() < 1 ||
      (bias.defined() && (!onednn_float(bias) || bias.dim() != 1)) || at::in_parallel_region())
    return at::linear(x, weight, bias);
  const int64_t K = weight.size(1), N = weight.size(0);
  TORCH_CHECK(x.size(-1) == K, "linear: input features ", x.size(-1), " against a weight [", N, ", ", K, "]");
  const at::Tensor a = x.reshape({-1, K});
  const at::Tensor rows = a.stride(1) == 1 && a.stride(0) >= K ? a : a.contiguous();
  const int64_t M = rows.size(0);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  at::Tensor out = at::empty({M, N}, x.options());
  if (bias.defined()) out.copy_(bias.expand({M, N}));
  cpu::gemm_threads(M, N, K, rows.data_ptr<float>(), rows.stride(0), weight.data_ptr<float>(), weight.stride(1),
                    bias.defined() ? 1.0f : 0.0f, out.data_ptr<float>(), N);
  return out.view(shape);
}

at::Tensor gemm_layout(const at::Tensor& w) {
  if (!onednn_linear || !onednn_float(w) || w.dim() != 2 || in_gemm_layout(w)) return w;
  at::Tensor t = empty_large({w.size(1), w.size(0)}, w.options());
  write_transposed(w, t.data_ptr<float>(), w.size(0), 0);
  return t.t();
}

at::Tensor gemm_layout_cat(const std::vector<at::Tensor>& weights) {
  TORCH_CHECK(!weights.empty(), "gemm_layout_cat: no weights");
  const at::Tensor& first = weights.front();
  bool direct = onednn_linear && onednn_float(first) && first.dim() == 2;
  int64_t out = 0;
  for (const at::Tensor& w : weights) {
    direct = direct && w.dim() == 2 && w.size(1) == first.size(1) && onednn_float(w);
    out += w.size(0);
  }
  if (!direct) return gemm_layout(at::cat(weights, 0));
  at::Tensor t = empty_large({first.size(1), out}, first.options());
  int64_t offset = 0;
  for (const at::Tensor& w : weights) {
    write_transposed(w, t.data_ptr<float>(), out, offset);
    offset += w.size(0);
  }
  return t.t();
}

void use_gemm_layout(torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  for (const auto& m : module.modules(/*include_self=*/true))
    if (auto* l = dynamic_cast<LinearImpl*>(m.get())) l->weight.set_data(gemm_layout(l->weight));
}

void set_onednn_linear(bool on) { onednn_linear = on; }

}  // namespace fluxmpi::nn
