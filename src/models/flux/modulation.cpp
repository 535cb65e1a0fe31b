#include "models/flux/modulation.h"

#include "models/flux/fused.h"

namespace fluxmpi::flux {

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  // fp32 and bf16 on the CPU: one pass (libtorch 1.13's bf16 layer_norm is 10x slower than its
  // fp32 one; in fp32 the pass saves addcmul's second pass over the activations).
  if (fused::applies(x) && x.dim() == 3 && x.is_contiguous() && shift.scalar_type() == x.scalar_type() &&
      scale.scalar_type() == x.scalar_type() && shift.stride(-1) == 1 && scale.stride(-1) == 1)
    return fused::layer_norm_modulate(x, shift, scale, 1e-6);
  at::Tensor normed = at::layer_norm(x, {x.size(-1)}, /*weight=*/{}, /*bias=*/{}, 1e-6);
  // normed * (1 + scale) + shift in one pass (in fp32 the same product and sum).
  return at::addcmul(shift.unsqueeze(1), normed, 1 + scale.unsqueeze(1));
}

AdaNormImpl::AdaNormImpl(int64_t dim, int64_t chunks_) : num_chunks(chunks_) {
  linear = register_module("linear", nn::Linear(dim, chunks_ * dim));
}

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return at::addcmul(x, gate.unsqueeze(1), y);
}

std::vector<at::Tensor> AdaNormImpl::chunks(const at::Tensor& temb, ModulationCache* cache) const {
  // temb: [B, D] -> num_chunks x [B, D]
  if (cache != nullptr && cache->temb.defined() && cache->temb.sizes() == temb.sizes() &&
      cache->temb.scalar_type() == temb.scalar_type() && cache->temb.device() == temb.device() &&
      at::equal(cache->temb, temb))
    return cache->chunks;
  std::vector<at::Tensor> out = linear->forward(at::silu(temb)).chunk(num_chunks, 1);
  if (cache != nullptr) *cache = ModulationCache{temb.clone(), out};
  return out;
}

}  // namespace fluxmpi::flux
