#pragma once
/// What FluxPriorReduxPipeline hands FluxPipeline for one prompt and N reference images: the
/// prompt's text embeddings (or zeros, as the prior makes them without text encoders) with each
/// image's Redux tokens appended, scaled per image and summed over the images:
///   prompt_embeds = sum_i prompt_scale_i * cat(text, image_embeds_i)   [S + L, D]
///   pooled        = sum_i pooled_scale_i * pooled_text                 [P]
/// FluxPipeline then runs on these with text ids zeros(S + L, 3).

#include <ATen/ATen.h>

#include <vector>

namespace fluxmpi::siglip {

struct ReduxPrompt {
  at::Tensor prompt_embeds;  ///< [S + L, D]
  at::Tensor pooled;         ///< [P]
};

/// `text`: [S, D], `pooled`: [P] (the prompt's T5 / CLIP embeddings, or zeros); `image_embeds`:
/// [N, L, D] in the same dtype; one scale per image in each list (a single value is given N times).
/// The arithmetic is the prior's: scales rounded to the embeddings' dtype, products, then the sum
/// over images.
ReduxPrompt redux_prompt(const at::Tensor& text, const at::Tensor& pooled, const at::Tensor& image_embeds,
                         const std::vector<double>& prompt_scales, const std::vector<double>& pooled_scales);

}  // namespace fluxmpi::siglip
