#pragma once
/// FluxControlNetPipeline's control images (diffusers 0.40, prepare_image and the VAE encode of
/// __call__): each control image resized to the output size (Pillow's LANCZOS) and mapped to [-1, 1]
/// as VaeImageProcessor.preprocess does; for the InstantX and Union layouts then VAE-encoded with
/// latent_dist.sample(generator), normalised and packed like the latents; for the XLabs layout
/// (input_hint_block) the pixels themselves. One CPU generator per image (seed S + i) draws, in
/// order, the sample of each control image (latent layouts only), then the noise.

#include <ATen/ATen.h>

#include <vector>

#include "io/image_file.h"
#include "models/flux/latents.h"
#include "models/vae/vae_encoder.h"

namespace fluxmpi::pipeline {

struct ControlNetConditioning {
  /// Per control image, in the run dtype: packed latents [1, L, 4C], or pixels [1, 3, H, W] (XLabs).
  std::vector<at::Tensor> controls;
  at::Tensor initial;  ///< [1, L, 4C] the packed noise, in the run dtype
};

/// The conditioning of one image: `encoder` in the run dtype (unused with `pixels`), `seed` S + i.
ControlNetConditioning controlnet_conditioning(const std::vector<io::Image8>& images, bool pixels, int64_t seed,
                                              const vae::VaeEncoder* encoder, const flux::LatentGeometry& geometry,
                                              at::ScalarType dtype, const vae::EncodeOptions& options);

}  // namespace fluxmpi::pipeline
