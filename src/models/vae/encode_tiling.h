#pragma once
/// How the VAE encoder is applied to a batch of images: all at once, one image at a time
/// (slicing), or in overlapping pixel tiles encoded one at a time whose moments are blended
/// (tiling). Semantics of diffusers 0.40 AutoencoderKL.encode / _encode / _tiled_encode with
/// enable_slicing / enable_tiling: slicing splits the batch first, then each slice is tiled when
/// its image exceeds tile_sample_min_size in some side.

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

#include "models/vae/tiling.h"

namespace fluxmpi::vae {

/// The same switches as decoding: diffusers' enable_tiling / enable_slicing act on both halves.
using EncodeOptions = DecodeOptions;

/// The encode side of diffusers' tile geometry (the same TileGeometry, read the other way round).
struct EncodeTiles {
  TileGeometry geometry;

  /// Pixels between the starts of two neighbouring tiles: int(sample_tile * (1 - overlap)).
  int64_t sample_stride() const;
  /// Latent rows (columns) of the moments blended between neighbours: int(latent_tile * overlap).
  int64_t blend_extent() const;
  /// Latent cells each tile contributes before the next one starts.
  int64_t row_limit() const { return geometry.latent_tile - blend_extent(); }
  /// diffusers tiles only images larger than one tile in some side.
  bool applies(int64_t height, int64_t width) const;
  /// Tiles an image of this size is cut into (1 when tiling does not apply).
  int64_t tile_count(int64_t height, int64_t width) const;
};

/// One encoder pass: x [B, C, H, W] -> moments [B, 2 * latent_channels, h, w].
using MomentsFn = std::function<at::Tensor(const at::Tensor&)>;

/// x [B, C, H, W] -> moments, computed as `options` say: with slicing one image at a time; with
/// tiling (when the image exceeds one tile) in tiles of sample_tile pixels every sample_stride(),
/// each tile's moments blended into the tile above and the one to its left over blend_extent()
/// latent rows and columns by a linear ramp, cropped to row_limit() and concatenated. Tiled
/// moments are not those of a whole-image encode (each tile sees only its own pixels); their size
/// is the sum of the crops, the untiled size whenever sample_stride() is a multiple of the scale
/// factor. Every tile must be at least scale factor / 2 pixels on each side (diffusers fails too).
at::Tensor encode_moments(const MomentsFn& encode, const at::Tensor& x, const EncodeTiles& tiles,
                          const EncodeOptions& options);

}  // namespace fluxmpi::vae
