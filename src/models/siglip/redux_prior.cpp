// Semantics of diffusers FluxPriorReduxPipeline.__call__ after the image encoding (pipelines/flux/
// pipeline_flux_prior_redux.py): cat([prompt_embeds] * N, image_embeds), *= scales[:, None, None],
// sum(dim=0); the same for the pooled embeddings.

#include "models/siglip/redux_prior.h"

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::siglip {

ReduxPrompt redux_prompt(const at::Tensor& text, const at::Tensor& pooled, const at::Tensor& image_embeds,
                         const std::vector<double>& prompt_scales, const std::vector<double>& pooled_scales) {
  nn::check_shape(text, {-1, -1}, "Redux text embeddings [S, D]");
  nn::check_shape(pooled, {-1}, "Redux pooled embeddings [P]");
  nn::check_shape(image_embeds, {-1, -1, text.size(1)}, "Redux image embeddings [N, L, D]");
  const int64_t N = image_embeds.size(0);
  FLUX_CHECK(N >= 1, "Redux needs at least one image");
  FLUX_CHECK(static_cast<int64_t>(prompt_scales.size()) == N && static_cast<int64_t>(pooled_scales.size()) == N,
             "one Redux scale per image: ", prompt_scales.size(), " and ", pooled_scales.size(), " for ", N, " images");
  const at::ScalarType dtype = image_embeds.scalar_type();
  const at::Device device = image_embeds.device();
  auto scales_of = [&](const std::vector<double>& s) { return at::tensor(s, at::kDouble).to(device, dtype); };
  at::Tensor texts = text.to(device, dtype).unsqueeze(0).expand({N, text.size(0), text.size(1)});
  at::Tensor joint = at::cat({texts, image_embeds}, 1) * scales_of(prompt_scales).view({N, 1, 1});
  at::Tensor pools = pooled.to(device, dtype).unsqueeze(0).expand({N, pooled.size(0)}) * scales_of(pooled_scales).view({N, 1});
  return {joint.sum(0), pools.sum(0)};
}

}  // namespace fluxmpi::siglip
