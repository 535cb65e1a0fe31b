#pragma once
/// Conditioning embeddings of FLUX: sinusoidal timestep projection, timestep / guidance MLPs and
/// the pooled-text projection, summed into temb. Semantics of diffusers
/// CombinedTimestep(Guidance)TextProjEmbeddings.

#include <torch/nn/module.h>

#include "io/configs.h"
#include "models/common/layers.h"

namespace fluxmpi::flux {

/// Sinusoidal projection of t: [B] -> [B, channels], cos half first (flip_sin_to_cos), frequencies
/// exp(-ln(10000) k / (channels/2)) in float32.
at::Tensor timestep_projection(const at::Tensor& t, int64_t channels);

/// linear_1 -> SiLU -> linear_2 (diffusers TimestepEmbedding and PixArtAlphaTextProjection).
class TwoLayerMlpImpl : public torch::nn::Module {
 public:
  TwoLayerMlpImpl(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x) const;
  nn::Linear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(TwoLayerMlp);

/// time_text_embed: temb = timestep_embedder(proj(t)) [+ guidance_embedder(proj(g))] + text_embedder(pooled).
class TimeTextEmbedImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kProjectionChannels = 256;
  TimeTextEmbedImpl(int64_t dim, int64_t pooled_dim, bool with_guidance);
  /// timestep, guidance: [B], already scaled by 1000; pooled: [B, pooled_dim] -> [B, D].
  at::Tensor forward(const at::Tensor& timestep, const at::Tensor& guidance, const at::Tensor& pooled) const;
  TwoLayerMlp timestep_embedder{nullptr}, guidance_embedder{nullptr}, text_embedder{nullptr};
};
TORCH_MODULE(TimeTextEmbed);

}  // namespace fluxmpi::flux
