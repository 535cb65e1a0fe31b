#pragma once
/// FLUX latent geometry: image size -> latent size, packing of 2x2 latent patches into tokens,
/// and the position ids of image and text tokens. Semantics of diffusers FluxPipeline
/// (_pack_latents, _unpack_latents, _prepare_latent_image_ids).

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace fluxmpi::flux {

struct LatentGeometry {
  int64_t height = 0;         ///< output image height after flooring (pixels)
  int64_t width = 0;
  int64_t latent_height = 0;  ///< h = 2 * (H // (2 * vae_scale_factor))
  int64_t latent_width = 0;
  int64_t channels = 16;      ///< latent channels = in_channels / 4

  int64_t tokens() const { return (latent_height / 2) * (latent_width / 2); }  ///< L_img
  int64_t token_dim() const { return channels * 4; }                           ///< 64 for FLUX
};

/// Floors a requested size to multiples of 2 * vae_scale_factor as diffusers does. Returns
/// geometry with height/width = the size of the produced image. Sizes that floor to zero
/// are reported by the caller (see is_empty()).
LatentGeometry latent_geometry(int64_t height, int64_t width, int64_t vae_scale_factor, int64_t latent_channels);
inline bool is_empty(const LatentGeometry& g) { return g.latent_height == 0 || g.latent_width == 0; }

/// [B, C, h, w] -> [B, (h/2)(w/2), 4C]; feature index c*4 + dy*2 + dx, tokens row-major.
at::Tensor pack_latents(const at::Tensor& unpacked);
/// [B, (h/2)(w/2), 4C] -> [B, C, h, w] (inverse of pack_latents).
at::Tensor unpack_latents(const at::Tensor& packed, int64_t latent_height, int64_t latent_width);

/// [(h/2)(w/2), 3] rows (0, row, col), row-major, float32.
at::Tensor image_position_ids(int64_t latent_height, int64_t latent_width);
/// FluxKontextPipeline's reference image: image_position_ids with the first axis 1, float32.
at::Tensor reference_position_ids(int64_t latent_height, int64_t latent_width);
/// zeros [S, 3] float32 (the pipeline's text ids).
at::Tensor text_position_ids(int64_t sequence_length);

}  // namespace fluxmpi::flux
