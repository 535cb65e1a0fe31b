// Semantics of diffusers 0.40 AutoencoderKL.encode (use_slicing: _encode per image) and _encode /
// _tiled_encode (use_tiling, image side > tile_sample_min_size): tiles of tile_sample_min_size
// pixels start every int(tile_sample_min_size * (1 - tile_overlap_factor)) pixels; each tile's
// moments (encoder, then quant_conv) are blended into the (already blended) tile above and the one
// to its left over int(tile_latent_min_size * tile_overlap_factor) cells, and the top-left
// row_limit x row_limit cells of each are kept. The distribution is formed afterwards, from the
// blended moments.
#include "models/vae/encode_tiling.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::vae {

int64_t EncodeTiles::sample_stride() const {
  // int() of a float product, as in Python: truncation towards zero.
  return static_cast<int64_t>(static_cast<double>(geometry.sample_tile) * (1.0 - geometry.overlap));
}

int64_t EncodeTiles::blend_extent() const {
  return static_cast<int64_t>(static_cast<double>(geometry.latent_tile) * geometry.overlap);
}

bool EncodeTiles::applies(int64_t height, int64_t width) const {
  return height > geometry.sample_tile || width > geometry.sample_tile;
}

int64_t EncodeTiles::tile_count(int64_t height, int64_t width) const {
  if (!applies(height, width)) return 1;
  const int64_t s = sample_stride();
  return ((height + s - 1) / s) * ((width + s - 1) / s);
}

namespace {

at::Tensor tiled_moments(const MomentsFn& encode, const at::Tensor& x, const EncodeTiles& tiles) {
  const int64_t tile = tiles.geometry.sample_tile, stride = tiles.sample_stride();
  FLUX_CHECK(stride > 0, "VAE tile of ", tile, " pixels has no stride");
  // Blending only reads the previous row of tiles and the tile to the left, so each row is
  // blended as soon as it is encoded: one row of moments is kept, not the whole grid.
  return run_tiled(encode, x, tile, stride, tiles.blend_extent(), tiles.row_limit());
}

}  // namespace

at::Tensor encode_moments(const MomentsFn& encode, const at::Tensor& x, const EncodeTiles& tiles,
                          const EncodeOptions& options) {
  // x: [B, C, H, W]
  FLUX_CHECK(x.dim() == 4, "VAE encoder input must be [B, C, H, W], got ", nn::shape_string(x.sizes()));
  // The encoder's outputs are inference tensors: blending writes into them in place.
  c10::InferenceMode guard;
  auto one_pass = [&](const at::Tensor& images) {
    return options.tiling && tiles.applies(images.size(2), images.size(3)) ? tiled_moments(encode, images, tiles)
                                                                            : encode(images);
  };
  if (!options.slicing || x.size(0) == 1) return one_pass(x);
  std::vector<at::Tensor> moments;
  for (int64_t b = 0; b < x.size(0); ++b) moments.push_back(one_pass(x.slice(0, b, b + 1)));
  return at::cat(moments, 0);
}

}  // namespace fluxmpi::vae
