#pragma once
/// FLUX.2 latent geometry, initial noise, packing and position ids. Semantics of diffusers
/// Flux2Pipeline / Flux2KleinPipeline (prepare_latents, _pack_latents, _prepare_latent_ids,
/// _prepare_text_ids, _unpack_latents_with_ids, _unpatchify_latents).
///
/// The sizes are FLUX.1's (flux::LatentGeometry: h, w = 2 * (H // (2 * vae_scale_factor)), L =
/// (h/2)(w/2) tokens of 4 * latent_channels features), but the layout differs: FLUX.2 draws its noise
/// directly in the patchified shape [n, 4C, h/2, w/2] (channel index c*4 + dy*2 + dx) and packs it by
/// a plain flatten, and its position ids have 4 axes (t, row, col, l) and are integers.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "models/flux/latents.h"

namespace fluxmpi::flux2 {

using flux::LatentGeometry;
/// latent_geometry(H, W, vae_scale_factor, latent_channels): the same flooring as FLUX.1.
using flux::latent_geometry;

/// randn_tensor([n, 4C, h/2, w/2]) with ONE torch.Generator("cpu").manual_seed(seed) drawing the
/// whole batch at once (diffusers' single-generator call, num_images_per_prompt > 1 included), in
/// `dtype` (a bf16 draw is not a rounded fp32 draw), on the CPU.
at::Tensor initial_noise(int64_t seed, int64_t num_images, const LatentGeometry& geometry, at::ScalarType dtype);
/// The same with a list of generators: image i is drawn alone ([1, 4C, h/2, w/2]) from its own
/// generator seeded seeds[i]; the images are concatenated.
at::Tensor initial_noise(const std::vector<int64_t>& seeds, const LatentGeometry& geometry, at::ScalarType dtype);

/// patchified [n, C4, h2, w2] -> packed [n, h2*w2, C4] (tokens row-major), contiguous.
at::Tensor pack_latents(const at::Tensor& patchified);
/// packed [n, L, C4] -> patchified [n, C4, H, W], each token scattered to (row, col) of its id
/// (ids [L, 4] shared by the batch, or [n, L, 4]); H, W = max id + 1 per axis, cells no token names
/// stay 0 (as diffusers' scatter).
at::Tensor unpack_latents_with_ids(const at::Tensor& packed, const at::Tensor& ids);
/// patchified [n, 4c, h2, w2] -> VAE latents [n, c, 2*h2, 2*w2]; channel c*4 + dy*2 + dx goes to
/// pixel (2*y + dy, 2*x + dx) of channel c.
at::Tensor unpatchify_latents(const at::Tensor& patchified);
/// VAE latents [n, c, h, w] (h, w even) -> patchified [n, 4c, h/2, w/2] (the inverse of
/// unpatchify_latents; diffusers' _patchify_latents), contiguous.
at::Tensor patchify_latents(const at::Tensor& latents);

/// [L, 4] int64 rows (t = 0, row, col, l = 0), row-major over the (h/2, w/2) token grid.
at::Tensor latent_ids(const LatentGeometry& geometry);
/// [S, 4] int64 rows (0, 0, 0, l = token index).
at::Tensor text_ids(int64_t sequence_length);
/// Reference image `index` (0-based) of a multi-reference call, of an (rows x cols) token grid:
/// [rows * cols, 4] int64 rows (t = 10 + 10 * index, row, col, 0), row-major (diffusers'
/// _prepare_image_ids with its scale 10: each reference sits at its own time offset).
at::Tensor reference_ids(int64_t index, int64_t rows, int64_t cols);

}  // namespace fluxmpi::flux2
