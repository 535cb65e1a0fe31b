#pragma once
/// FLUX.2's global modulation and its adaptive layer norms. Unlike FLUX.1, where every block has
/// its own AdaLayerNormZero linear, three linears on SiLU(temb) are computed once per forward and
/// shared by all blocks of their kind: the double blocks' image and text streams (two sets of
/// (shift, scale, gate) each: attention, then MLP) and the single blocks (one set). Semantics of
/// diffusers Flux2Modulation and AdaLayerNormContinuous (norm_out).

#include <torch/nn/module.h>

#include "models/common/layers.h"

namespace fluxmpi::flux2 {

/// linear (no bias) on SiLU(temb): D -> 3 * sets * D.
class ModulationImpl : public torch::nn::Module {
 public:
  ModulationImpl(int64_t dim, int64_t sets);
  /// temb: [B, D] -> [B, 3 * sets * D], the (shift, scale, gate) of each set in order.
  at::Tensor forward(const at::Tensor& temb) const;
  nn::Linear linear{nullptr};
};
TORCH_MODULE(Modulation);

/// One (shift, scale, gate) set, each [B, D] (views into a modulation vector).
struct ModulationSet {
  at::Tensor shift, scale, gate;
};
/// Set `index` of a modulation vector [B, >= 3 * (index + 1) * D].
ModulationSet modulation_set(const at::Tensor& vectors, int64_t dim, int64_t index);

/// x: [B, L, D] -> LayerNorm(x) (no affine, eps) * (1 + scale) + shift, scale/shift [B, D].
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);
/// x + gate * y with gate [B, D] (the blocks' gated residuals).
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

/// norm_out: linear (no bias) on SiLU(temb) gives (scale, shift) — scale first — for the final
/// LayerNorm of the image tokens.
class OutputNormImpl : public torch::nn::Module {
 public:
  OutputNormImpl(int64_t dim, double eps);
  /// x: [B, L, D], temb: [B, D] -> [B, L, D].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb) const;
  nn::Linear linear{nullptr};
  double eps;
};
TORCH_MODULE(OutputNorm);

}  // namespace fluxmpi::flux2
