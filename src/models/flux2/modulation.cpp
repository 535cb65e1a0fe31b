#include "models/flux2/modulation.h"

#include "core/error.h"
#include "models/flux/fused.h"

namespace fluxmpi::flux2 {

ModulationImpl::ModulationImpl(int64_t dim, int64_t sets) {
  linear = register_module("linear", nn::Linear(dim, 3 * sets * dim, /*bias=*/false));
}

at::Tensor ModulationImpl::forward(const at::Tensor& temb) const { return linear->forward(at::silu(temb)); }

ModulationSet modulation_set(const at::Tensor& vectors, int64_t dim, int64_t index) {
  FLUX_CHECK(vectors.dim() == 2 && vectors.size(1) >= 3 * (index + 1) * dim, "modulation vectors ", vectors.sizes(),
             " hold no set ", index, " of width ", dim);
  const int64_t at = 3 * index * dim;
  return {vectors.narrow(1, at, dim), vectors.narrow(1, at + dim, dim), vectors.narrow(1, at + 2 * dim, dim)};
}

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  // bf16 on the CPU: FLUX.1's one-pass kernel, the same operators (libtorch 1.13's bf16 layer_norm is slow).
  if (x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 3 && x.is_contiguous() &&
      shift.scalar_type() == at::kBFloat16 && scale.scalar_type() == at::kBFloat16 && shift.stride(-1) == 1 &&
      scale.stride(-1) == 1)
    return flux::fused::layer_norm_modulate(x, shift, scale, eps);
  at::Tensor normed = at::layer_norm(x, {x.size(-1)}, /*weight=*/{}, /*bias=*/{}, eps);
  return normed * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return x + gate.unsqueeze(1) * y;
}

OutputNormImpl::OutputNormImpl(int64_t dim, double eps_) : eps(eps_) {
  linear = register_module("linear", nn::Linear(dim, 2 * dim, /*bias=*/false));
}

at::Tensor OutputNormImpl::forward(const at::Tensor& x, const at::Tensor& temb) const {
  auto c = linear->forward(at::silu(temb).to(x.scalar_type())).chunk(2, 1);  // scale, shift
  return modulate(x, /*shift=*/c[1], /*scale=*/c[0], eps);
}

}  // namespace fluxmpi::flux2
