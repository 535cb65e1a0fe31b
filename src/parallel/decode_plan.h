#pragma once
/// The VAE decode stage in the plan (docs/partition.md, "The decode"): the decoder's activations
/// on the leader, and which ranks of a pipeline decode tiles. With tiling and more than one tile,
/// the tiles of each pass go round robin to the leader and the ranks after it (as many as there
/// are tiles); each such helper loads the VAE decoder once its blocks are done and freed, so its
/// decode stage is the decoder, one tile's activations and its decoded tiles of a pass waiting for
/// the leader. A helper whose budget cannot hold that stage is left out. Pure functions of the
/// configs, like the rest of the planner.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/configs.h"

namespace fluxmpi::parallel {

/// diffusers AutoencoderKL's tile geometry (tile_sample_min_size = sample_size, tile_latent_min_size
/// = int(sample_size / 2^(levels - 1)), tiles every int(tile_latent_min_size * (1 - overlap))): the
/// planner's copy of models/vae/tiling.h, which needs libtorch.
struct VaeTiles {
  int64_t sample_tile = 0, latent_tile = 0, stride = 1;
  bool applies(int64_t h, int64_t w) const { return h > latent_tile || w > latent_tile; }
  /// Tiles of an h x w latent (1 when tiling does not apply).
  int64_t count(int64_t h, int64_t w) const;
};
VaeTiles vae_tiles(const io::VaeConfig& config);

/// One decoder pass as the plan sees it.
struct VaeDecodeShape {
  io::VaeConfig vae;
  int64_t latent_height = 0, latent_width = 0;
  int64_t batch = 1;                  ///< images per pass: the microbatch, or 1 with --vae-slicing
  int64_t dtype_bytes = 4;
  int64_t attention_chunk_bytes = 0;  ///< the mid-block attention's score chunk limit (0: none)
};

/// The leader's activations: the largest decoder level's tensors alive at once and the mid-block
/// attention's score chunks, for the whole latent or (tiled, when tiling applies) one tile, plus
/// the decoded tiles of two rows and the output image.
uint64_t vae_decode_activation_bytes(const VaeDecodeShape& shape, bool tiled);
/// A helper's activations: one tile's pass, the pass's latents and `kept_tiles` decoded tiles
/// (its share of a pass, sent but not yet received by the leader).
uint64_t vae_helper_activation_bytes(const VaeDecodeShape& shape, int64_t kept_tiles);

/// Which ranks decode the tiles of a pass.
struct DecodePlan {
  std::vector<int> ranks = {0};     ///< the leader first; {0}: the leader decodes alone
  int64_t tiles = 1;                ///< tiles of one pass
  std::map<int, uint64_t> helper_bytes;  ///< each helper's decode stage (runtime, decoder, activations)
  std::map<int, uint64_t> left_out;      ///< ranks whose budget cannot hold that stage: its size
  /// The tiles tile k of a pass goes to: ranks[k % ranks.size()].
  bool spread() const { return ranks.size() > 1; }
  /// "decode: 9 tiles a pass, round robin over ranks 0-2 (...)\n", or "" when not spread.
  std::string describe(const std::map<int, uint64_t>& budgets) const;
};

/// The decode plan of `world_size` ranks (one pipeline). `tiled`: the plan decodes in tiles.
/// `helper_fixed_bytes`: what a helper holds besides the decoder's activations (the runtime and
/// the decoder's weights).
DecodePlan plan_decode(const VaeDecodeShape& shape, bool tiled, int world_size, uint64_t helper_fixed_bytes,
                       const std::map<int, uint64_t>& budgets);

}  // namespace fluxmpi::parallel
