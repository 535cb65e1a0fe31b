#pragma once
/// Adaptive layer norms of FLUX: temb -> SiLU -> linear gives per-sample shift/scale/gate vectors;
/// x is LayerNorm'ed (no affine, eps 1e-6) then x * (1 + scale) + shift. Semantics of diffusers
/// AdaLayerNormZero (6 chunks), AdaLayerNormZeroSingle (3) and AdaLayerNormContinuous (2, in the
/// order scale, shift).

#include <torch/nn/module.h>

#include <vector>

#include "models/common/layers.h"

namespace fluxmpi::flux {

/// x: [B, L, D], shift/scale: [B, D] -> LayerNorm(x) * (1 + scale) + shift.
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);
/// x: [B, L, D], gate: [B, D], y: [B, L, D] -> x + gate * y (the blocks' gated residuals).
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

/// The vectors an AdaNorm made from one temb, kept between calls: the patches of a pipelined step
/// share the step's temb, so a block computes them once per step instead of once per patch
/// (reading the AdaNorm weights, a matrix-vector product, each time).
struct ModulationCache {
  at::Tensor temb;
  std::vector<at::Tensor> chunks;
};

/// Holds `linear` (D -> chunks * D). chunks(temb) returns the `chunks` vectors [B, D] in the
/// order of the linear's output; with `cache`, those it holds when its temb equals this one
/// (same values: the same vectors, bit for bit), else new ones, which it then holds.
class AdaNormImpl : public torch::nn::Module {
 public:
  AdaNormImpl(int64_t dim, int64_t chunks);
  std::vector<at::Tensor> chunks(const at::Tensor& temb, ModulationCache* cache = nullptr) const;
  nn::Linear linear{nullptr};
  int64_t num_chunks;
};
TORCH_MODULE(AdaNorm);

}  // namespace fluxmpi::flux
