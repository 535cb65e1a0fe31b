#pragma once
/// Conditioning embedding of FLUX.2: sinusoidal projections of timestep and guidance, each through
/// a two-layer MLP without biases, summed into temb. No pooled text input (FLUX.1 has one).
/// Semantics of diffusers Flux2TimestepGuidanceEmbeddings.

#include <torch/nn/module.h>

#include "models/common/layers.h"

namespace fluxmpi::flux2 {

/// linear_1 -> SiLU -> linear_2, no biases (diffusers TimestepEmbedding with sample_proj_bias=False).
class TimestepEmbeddingImpl : public torch::nn::Module {
 public:
  TimestepEmbeddingImpl(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x) const;
  nn::Linear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(TimestepEmbedding);

/// time_guidance_embed: temb = timestep_embedder(proj(t)) [+ guidance_embedder(proj(g))].
class TimeGuidanceEmbedImpl : public torch::nn::Module {
 public:
  TimeGuidanceEmbedImpl(int64_t channels, int64_t dim, bool with_guidance);
  /// timestep, guidance: [B] in the run dtype, already scaled by 1000 (guidance undefined
  /// without a guidance embedder) -> [B, D].
  at::Tensor forward(const at::Tensor& timestep, const at::Tensor& guidance) const;
  TimestepEmbedding timestep_embedder{nullptr}, guidance_embedder{nullptr};
  int64_t channels;
};
TORCH_MODULE(TimeGuidanceEmbed);

}  // namespace fluxmpi::flux2
