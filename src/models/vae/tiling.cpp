// Semantics of diffusers AutoencoderKL.decode with use_slicing / use_tiling: _decode tiles when
// the latent is larger than tile_latent_min_size; run_tiled cuts the latent into tiles that
// start every int(tile_latent_min_size * (1 - tile_overlap_factor)) cells, decodes each, blends
// each decoded tile into the (already blended) tile above and the one to its left, and keeps the
// top-left row_limit x row_limit pixels of each.
#include "models/vae/tiling.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::vae {

int64_t TileGeometry::latent_stride() const {
  // int() of a float product, as in Python: truncation towards zero.
  return static_cast<int64_t>(static_cast<double>(latent_tile) * (1.0 - overlap));
}

int64_t TileGeometry::blend_extent() const {
  return static_cast<int64_t>(static_cast<double>(sample_tile) * overlap);
}

bool TileGeometry::applies(int64_t latent_height, int64_t latent_width) const {
  return latent_height > latent_tile || latent_width > latent_tile;
}

int64_t TileGeometry::tile_count(int64_t latent_height, int64_t latent_width) const {
  if (!applies(latent_height, latent_width)) return 1;
  const int64_t s = latent_stride();
  return ((latent_height + s - 1) / s) * ((latent_width + s - 1) / s);
}

TileGeometry tile_geometry(const io::VaeConfig& config) {
  TileGeometry g;
  g.sample_tile = config.sample_size;
  g.latent_tile = static_cast<int64_t>(static_cast<double>(config.sample_size) /
                                       static_cast<double>(config.scale_factor()));
  g.scale = config.scale_factor();
  g.out_channels = config.out_channels;
  FLUX_CHECK(g.latent_tile > 0 && g.latent_stride() > 0, "VAE sample_size ", config.sample_size,
             " gives no usable tile for a scale factor of ", config.scale_factor());
  return g;
}

// Each line is computed as diffusers writes it, a * (1 - k / e) + b * (k / e) with Python-float
// weights, so the roundings match.
void blend_edge(const at::Tensor& a, at::Tensor& b, int64_t extent, int64_t dim) {
  const int64_t e = std::min({a.size(dim), b.size(dim), extent});
  for (int64_t k = 0; k < e; ++k) {
    const double w = static_cast<double>(k) / static_cast<double>(e);
    at::Tensor line = b.select(dim, k);
    line.copy_(a.select(dim, a.size(dim) - e + k) * (1.0 - w) + line * w);
  }
}

std::vector<Tile> tile_grid(int64_t h, int64_t w, int64_t tile, int64_t stride) {
  FLUX_CHECK(tile > 0 && stride > 0, "tiles of ", tile, " every ", stride);
  std::vector<Tile> grid;
  for (int64_t i = 0, row = 0; i < h; i += stride, ++row)
    for (int64_t j = 0, col = 0; j < w; j += stride, ++col)
      grid.push_back(Tile{row, col, i, j, std::min(i + tile, h) - i, std::min(j + tile, w) - j});
  return grid;
}

at::Tensor tile_input(const at::Tensor& x, const Tile& t) {
  return x.slice(2, t.top, t.top + t.height).slice(3, t.left, t.left + t.width).contiguous();
}

at::Tensor blend_tiles(const TileOutputFn& output, const std::vector<Tile>& grid, int64_t extent, int64_t limit) {
  std::vector<at::Tensor> above;  // the previous row of tiles, blended
  std::vector<at::Tensor> rows;   // each row of cropped tiles, concatenated
  std::vector<at::Tensor> row;
  std::vector<at::Tensor> crops;
  for (size_t k = 0; k < grid.size(); ++k) {
    at::Tensor out = output(k);
    if (!above.empty()) blend_edge(above[static_cast<size_t>(grid[k].col)], out, extent, 2);
    if (!row.empty()) blend_edge(row.back(), out, extent, 3);
    crops.push_back(out.slice(2, 0, limit).slice(3, 0, limit));
    row.push_back(std::move(out));
    if (k + 1 == grid.size() || grid[k + 1].row != grid[k].row) {
      rows.push_back(at::cat(crops, 3));
      crops.clear();
      above = std::move(row);
      row.clear();
    }
  }
  return at::cat(rows, 2);
}

at::Tensor run_tiled(const std::function<at::Tensor(const at::Tensor&)>& run, const at::Tensor& x, int64_t tile,
                     int64_t stride, int64_t extent, int64_t limit) {
  const std::vector<Tile> grid = tile_grid(x.size(2), x.size(3), tile, stride);
  return blend_tiles([&](size_t k) { return run(tile_input(x, grid[k])); }, grid, extent, limit);
}

at::Tensor decode_latents(const DecodeFn& decode, const at::Tensor& z, const TileGeometry& geometry,
                          const DecodeOptions& options) {
  // z: [B, latent_channels, h, w]
  FLUX_CHECK(z.dim() == 4, "VAE latents must be [B, C, h, w], got ", nn::shape_string(z.sizes()));
  // The decoder's outputs are inference tensors: blending writes into them in place.
  c10::InferenceMode guard;
  auto one_pass = [&](const at::Tensor& x) {
    if (!options.tiling || !geometry.applies(x.size(2), x.size(3))) return decode(x);
    if (options.tiles != nullptr) return options.tiles->decode(decode, x, geometry);
    return run_tiled(decode, x, geometry.latent_tile, geometry.latent_stride(), geometry.blend_extent(),
                     geometry.row_limit());
  };
  if (!options.slicing || z.size(0) == 1) return one_pass(z);
  std::vector<at::Tensor> images;
  for (int64_t b = 0; b < z.size(0); ++b) images.push_back(one_pass(z.slice(0, b, b + 1)));
  return at::cat(images, 0);
}

}  // namespace fluxmpi::vae
