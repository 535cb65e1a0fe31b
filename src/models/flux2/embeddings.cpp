#include "models/flux2/embeddings.h"

#include "core/error.h"
#include "models/flux/embeddings.h"

namespace fluxmpi::flux2 {

TimestepEmbeddingImpl::TimestepEmbeddingImpl(int64_t in, int64_t out) {
  linear_1 = register_module("linear_1", nn::Linear(in, out, /*bias=*/false));
  linear_2 = register_module("linear_2", nn::Linear(out, out, /*bias=*/false));
}

at::Tensor TimestepEmbeddingImpl::forward(const at::Tensor& x) const {
  return linear_2->forward(at::silu(linear_1->forward(x)));
}

TimeGuidanceEmbedImpl::TimeGuidanceEmbedImpl(int64_t channels_, int64_t dim, bool with_guidance) : channels(channels_) {
  timestep_embedder = register_module("timestep_embedder", TimestepEmbedding(channels, dim));
  if (with_guidance) guidance_embedder = register_module("guidance_embedder", TimestepEmbedding(channels, dim));
}

at::Tensor TimeGuidanceEmbedImpl::forward(const at::Tensor& timestep, const at::Tensor& guidance) const {
  // timestep, guidance: [B]. The sinusoid is FLUX.1's (cos half first, float32), cast to the input dtype.
  const auto dtype = timestep.scalar_type();
  at::Tensor temb = timestep_embedder->forward(flux::timestep_projection(timestep, channels).to(dtype));
  if (guidance_embedder) {
    FLUX_CHECK(guidance.defined(), "this FLUX.2 transformer has a guidance embedder: a guidance value is required");
    temb = temb + guidance_embedder->forward(flux::timestep_projection(guidance, channels).to(guidance.scalar_type()));
  }
  return temb;
}

}  // namespace fluxmpi::flux2
