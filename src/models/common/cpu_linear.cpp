#include "models/common/cpu_linear.h"

#include <ATen/Parallel.h>
#include <torch/nn/module.h>

#include <atomic>

#include "models/common/cpu_gemm.h"
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
  return w.t().contiguous().t();
}

void use_gemm_layout(torch::nn::Module& module) {
  at::NoGradGuard no_grad;
  for (const auto& m : module.modules(/*include_self=*/true))
    if (auto* l = dynamic_cast<LinearImpl*>(m.get())) l->weight.set_data(gemm_layout(l->weight));
}

void set_onednn_linear(bool on) { onednn_linear = on; }

}  // namespace fluxmpi::nn
