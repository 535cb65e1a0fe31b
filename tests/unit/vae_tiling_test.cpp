// The tiled loop's two halves (models/vae/tiling.h): the tile grid in diffusers' order, the blend
// of tiles computed elsewhere, and the TiledDecode seam the spread decode plugs into — each equal
// to the one-process run_tiled bit for bit.

#include <gtest/gtest.h>

#include <map>

#include "models/common/init.h"
#include "models/vae/tiling.h"
#include "models/vae/vae_decoder.h"
#include "support/tensor_compare.h"

namespace fluxmpi::vae {
namespace {

io::VaeConfig small_config() {
  io::VaeConfig c;
  c.latent_channels = 4;
  c.block_out_channels = {8, 16};
  c.layers_per_block = 1;
  c.norm_num_groups = 4;
  c.use_post_quant_conv = false;
  c.mid_block_add_attention = true;
  c.sample_size = 8;  // 2 levels: 4-cell latent tiles every 3 cells, 2 pixels blended
  return c;
}

// Decodes every tile first, last tile first, then blends: the order of the decoder calls must not
// matter, only which tile each output is.
class ReversedTiles : public TiledDecode {
 public:
  at::Tensor decode(const DecodeFn& decode, const at::Tensor& z, const TileGeometry& g) override {
    const std::vector<Tile> grid = tile_grid(z.size(2), z.size(3), g.latent_tile, g.latent_stride());
    std::map<size_t, at::Tensor> out;
    for (size_t k = grid.size(); k-- > 0;) out[k] = decode(tile_input(z, grid[k]));
    ++passes;
    return blend_tiles([&](size_t k) { return out.at(k); }, grid, g.blend_extent(), g.row_limit());
  }
  int passes = 0;
};

}  // namespace

TEST(VaeTileGrid, RowByRowWithCutEdgeTiles) {
  // 7 x 10 cells, 4-cell tiles every 3: rows start at 0, 3, 6; columns at 0, 3, 6, 9.
  const std::vector<Tile> grid = tile_grid(7, 10, 4, 3);
  ASSERT_EQ(grid.size(), 12u);
  EXPECT_EQ(grid[0].top, 0);
  EXPECT_EQ(grid[0].height, 4);
  EXPECT_EQ(grid[3].left, 9);
  EXPECT_EQ(grid[3].width, 1);   // the last column is cut at the edge
  EXPECT_EQ(grid[4].row, 1);
  EXPECT_EQ(grid[4].col, 0);
  EXPECT_EQ(grid[11].top, 6);
  EXPECT_EQ(grid[11].height, 1);
  const TileGeometry g{8, 4};
  EXPECT_EQ(static_cast<int64_t>(tile_grid(7, 10, g.latent_tile, g.latent_stride()).size()), g.tile_count(7, 10));
}

TEST(VaeTileGrid, GeometryKnowsTheDecodedTileShape) {
  const TileGeometry g = tile_geometry(small_config());
  EXPECT_EQ(g.scale, 2);
  EXPECT_EQ(g.out_channels, 3);
  EXPECT_EQ(g.latent_tile * g.scale, g.sample_tile);
}

TEST(VaeTiledDecode, TilesDecodedElsewhereBlendToTheSameBits) {
  VaeDecoder vae(small_config());
  nn::fill_random(*vae, 21);
  const at::Tensor z = at::randn({2, 4, 7, 10});
  for (bool slicing : {false, true}) {
    const at::Tensor local = vae->decode(z, DecodeOptions{true, slicing});
    ReversedTiles elsewhere;
    DecodeOptions options{true, slicing};
    options.tiles = &elsewhere;
    const at::Tensor spread = vae->decode(z, options);
    EXPECT_EQ(elsewhere.passes, slicing ? 2 : 1);
    EXPECT_TRUE(test::identical(slicing ? "sliced tiled image, tiles decoded last first" : "tiled image, tiles decoded last first",
                                spread, local));
  }
  // A latent within one tile is decoded whole: the seam is not asked.
  ReversedTiles unused;
  DecodeOptions options{true, false};
  options.tiles = &unused;
  const at::Tensor small = at::randn({1, 4, 4, 4});
  EXPECT_TRUE(test::identical("one-tile latent", vae->decode(small, options), vae->forward(small)));
  EXPECT_EQ(unused.passes, 0);
}

}  // namespace fluxmpi::vae
