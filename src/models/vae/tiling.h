#pragma once
/// How the VAE decoder is applied to a batch of latents: all at once, one image at a time
/// (slicing), or in overlapping latent tiles decoded one at a time and blended (tiling).
/// Semantics of diffusers AutoencoderKL.enable_slicing / enable_tiling (decode, _decode,
/// tiled_decode, blend_v, blend_h) with the tile sizes diffusers derives from the VAE config.

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "io/configs.h"

namespace fluxmpi::vae {

/// The tile geometry of diffusers' tiled decoding for one VAE.
struct TileGeometry {
  int64_t sample_tile = 0;  ///< pixels of a decoded tile's side: config sample_size
  int64_t latent_tile = 0;  ///< latent cells of a tile's side: sample_size / 2^(levels - 1)
  double overlap = 0.25;    ///< share of a tile that overlaps its neighbour
  int64_t scale = 1;        ///< pixels per latent cell along a side: 2^(levels - 1)
  int64_t out_channels = 3; ///< channels of a decoded tile

  /// Latent cells between the starts of two neighbouring tiles: int(latent_tile * (1 - overlap)).
  int64_t latent_stride() const;
  /// Pixel rows (columns) blended between neighbours: int(sample_tile * overlap).
  int64_t blend_extent() const;
  /// Pixels each tile contributes to the output before the next one starts.
  int64_t row_limit() const { return sample_tile - blend_extent(); }
  /// diffusers tiles only latents larger than one tile in some direction.
  bool applies(int64_t latent_height, int64_t latent_width) const;
  /// Tiles a latent of this size is cut into (1 when tiling does not apply).
  int64_t tile_count(int64_t latent_height, int64_t latent_width) const;
};
/// AutoencoderKL's defaults: tile_sample_min_size = sample_size, tile_latent_min_size =
/// int(sample_size / 2^(levels - 1)), tile_overlap_factor = 0.25.
TileGeometry tile_geometry(const io::VaeConfig& config);

class TiledDecode;

struct DecodeOptions {
  bool tiling = false;   ///< --vae-tiling
  bool slicing = false;  ///< --vae-slicing: images of a batch one at a time
  /// Tiled passes go here when set (not owned); else run_tiled in this process.
  TiledDecode* tiles = nullptr;
};

/// diffusers blend_v (dim 2) / blend_h (dim 3): the first e = min(extent, both sizes along `dim`)
/// rows or columns of `b` become, in place, a linear ramp from the last e of `a` to `b`'s own.
/// Shared by tiled decoding (pixels) and tiled encoding (moments).
void blend_edge(const at::Tensor& a, at::Tensor& b, int64_t extent, int64_t dim);

/// One tile of diffusers' tiled loop: rows [top, top + height) and columns [left, left + width)
/// of the input, at grid position (row, col).
struct Tile {
  int64_t row = 0, col = 0;
  int64_t top = 0, left = 0, height = 0, width = 0;
};
/// The tiles of an h x w input, `tile` x `tile` every `stride` (cut at the edges), in the order
/// diffusers visits them: row by row, left to right.
std::vector<Tile> tile_grid(int64_t h, int64_t w, int64_t tile, int64_t stride);
/// x[:, :, tile] as a contiguous tensor.
at::Tensor tile_input(const at::Tensor& x, const Tile& t);

/// The output of tile k of `grid` (k in grid order), wherever it was computed.
using TileOutputFn = std::function<at::Tensor(size_t k)>;
/// The blend-and-crop half of diffusers' tiled loop: asks `output` for each tile in grid order,
/// blends it over `extent` with the (already blended) tile above and the one to its left, crops
/// it to `limit` x `limit` and concatenates the crops. Only the previous row of tiles is kept.
at::Tensor blend_tiles(const TileOutputFn& output, const std::vector<Tile>& grid, int64_t extent, int64_t limit);

/// diffusers' tiled loop, shared by the decode and the encode: `run` on the tiles of
/// tile_grid(H, W, tile, stride) of x [B, C, H, W], one after the other, then blend_tiles.
at::Tensor run_tiled(const std::function<at::Tensor(const at::Tensor&)>& run, const at::Tensor& x, int64_t tile,
                     int64_t stride, int64_t extent, int64_t limit);

/// One decoder pass: z [B, latent_channels, h, w] -> image [B, C, h * s, w * s].
using DecodeFn = std::function<at::Tensor(const at::Tensor&)>;

/// Where the tiles of one tiled decoder pass are decoded. Without one, this process decodes them
/// one after the other (run_tiled); pipeline/tile_decode.h spreads them over the ranks of a
/// pipeline. Either way the result is run_tiled's, bit for bit.
class TiledDecode {
 public:
  virtual ~TiledDecode() = default;
  /// z [B, latent_channels, h, w], larger than one tile of `geometry` -> image [B, C, h * s, w * s].
  virtual at::Tensor decode(const DecodeFn& decode, const at::Tensor& z, const TileGeometry& geometry) = 0;
};

/// z [B, latent_channels, h, w] -> [B, C, H, W], decoded as `options` say: with slicing one
/// image of the batch at a time; with tiling (when the latent exceeds one tile) in tiles of
/// `geometry`, each blended into the tile above and the tile to its left over blend_extent()
/// rows and columns by a linear ramp, then cropped to row_limit() and concatenated.
at::Tensor decode_latents(const DecodeFn& decode, const at::Tensor& z, const TileGeometry& geometry,
                          const DecodeOptions& options);

}  // namespace fluxmpi::vae
