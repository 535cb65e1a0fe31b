#pragma once
/// The steps around the VAE decoder in diffusers FluxPipeline: packed transformer latents -> VAE
/// input, and decoded images -> 8-bit RGB (VaeImageProcessor.postprocess with output_type "pil").

#include <ATen/ATen.h>

#include <vector>

#include "io/configs.h"
#include "io/png.h"
#include "models/flux/latents.h"
#include "models/vae/vae_decoder.h"

namespace fluxmpi::vae {

/// packed: [B, L, 4C] -> [B, C, h, w] = unpack_latents(packed) / scaling_factor + shift_factor
/// (divide, then add, as FluxPipeline does), in the dtype of `packed`.
at::Tensor vae_input_from_packed(const at::Tensor& packed, const flux::LatentGeometry& geometry,
                                 const io::VaeConfig& config);

/// decoded: [B, 3, H, W] -> B images of H x W RGB pixels: clamp(x * 0.5 + 0.5, 0, 1) in the dtype of
/// `decoded`, then in float32 * 255 rounded half to even (numpy's rint) to uint8, channels last.
std::vector<io::RgbImage> to_rgb_images(const at::Tensor& decoded);

/// Everything after denoising for one image: packed latents [1, L, 4C] or [L, 4C] -> vae input ->
/// decode (in the decoder's dtype) -> RGB.
io::RgbImage decode_image(const VaeDecoder& vae, const at::Tensor& packed, const flux::LatentGeometry& geometry,
                          const io::VaeConfig& config, const DecodeOptions& options = {});
/// The same for a batch, packed [B, L, 4C], decoded in one call as `options` say (without
/// slicing all B images at once, as diffusers decodes a batch).
std::vector<io::RgbImage> decode_images(const VaeDecoder& vae, const at::Tensor& packed,
                                        const flux::LatentGeometry& geometry, const io::VaeConfig& config,
                                        const DecodeOptions& options);

}  // namespace fluxmpi::vae
