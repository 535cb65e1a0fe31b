#include "models/flux/embeddings.h"

#include <cmath>

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::flux {

at::Tensor timestep_projection(const at::Tensor& t, int64_t channels) {
  const int64_t half = channels / 2;
  // Same float32 op order as diffusers' get_timestep_embedding (downscale_freq_shift 0, scale 1).
  at::Tensor exponent = at::arange(0, half, at::TensorOptions().dtype(at::kFloat).device(t.device())) *
                        static_cast<float>(-std::log(10000.0));
  exponent = exponent / static_cast<float>(half);
  at::Tensor angles = t.unsqueeze(1).to(at::kFloat) * at::exp(exponent).unsqueeze(0);
  return at::cat({at::cos(angles), at::sin(angles)}, -1);
}

TwoLayerMlpImpl::TwoLayerMlpImpl(int64_t in, int64_t out) {
  linear_1 = register_module("linear_1", nn::Linear(in, out));
  linear_2 = register_module("linear_2", nn::Linear(out, out));
}

at::Tensor TwoLayerMlpImpl::forward(const at::Tensor& x) const { return linear_2->forward(at::silu(linear_1->forward(x))); }

TimeTextEmbedImpl::TimeTextEmbedImpl(int64_t dim, int64_t pooled_dim, bool with_guidance) {
  timestep_embedder = register_module("timestep_embedder", TwoLayerMlp(kProjectionChannels, dim));
  if (with_guidance) guidance_embedder = register_module("guidance_embedder", TwoLayerMlp(kProjectionChannels, dim));
  text_embedder = register_module("text_embedder", TwoLayerMlp(pooled_dim, dim));
}

at::Tensor TimeTextEmbedImpl::forward(const at::Tensor& timestep, const at::Tensor& guidance,
                                      const at::Tensor& pooled) const {
  // timestep, guidance: [B]; pooled: [B, P]
  const auto dtype = pooled.scalar_type();
  at::Tensor emb = timestep_embedder->forward(timestep_projection(timestep, kProjectionChannels).to(dtype));
  if (guidance_embedder) {
    FLUX_CHECK(guidance.defined(), "this model has a guidance embedding: a guidance value is required");
    emb = emb + guidance_embedder->forward(timestep_projection(guidance, kProjectionChannels).to(dtype));
  }
  return emb + text_embedder->forward(pooled);
}

}  // namespace fluxmpi::flux
