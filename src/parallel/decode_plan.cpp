#include "parallel/decode_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/units.h"
#include "parallel/param_formulas.h"
#include "parallel/partition.h"
#include "parallel/plan_text.h"

namespace fluxmpi::parallel {
namespace {

// The largest activation of the decoder (channels x area at some level) on an h x w latent times
// the tensors alive at once, plus the mid-block attention's score chunks, for a batch.
uint64_t decoder_pass_bytes(const VaeDecodeShape& s, int64_t h, int64_t w) {
  const io::VaeConfig& v = s.vae;
  const int64_t b = s.dtype_bytes;
  const int64_t latent_area = h * w;
  std::vector<int64_t> channels(v.block_out_channels.rbegin(), v.block_out_channels.rend());
  int64_t largest = channels.front() * latent_area;
  int64_t area = latent_area;
  for (size_t i = 0; i < channels.size(); ++i) {
    const int64_t in = i == 0 ? channels.front() : channels[i - 1];
    largest = std::max(largest, std::max(in, channels[i]) * area);
    if (i + 1 < channels.size()) {
      area *= 4;  // the upsampler doubles both sides
      largest = std::max(largest, channels[i] * area);
    }
  }
  uint64_t bytes = static_cast<uint64_t>(kVaeLiveTensors * largest * b) * static_cast<uint64_t>(s.batch);
  if (v.mid_block_add_attention) {
    // The mid-block attention (one head) splits its query rows so that a [rows, L] score chunk
    // of the batch stays within the chunk limit (models/vae/mid_block_attention.cpp).
    const int64_t L = latent_area, row = s.batch * L * b;
    int64_t rows = L;
    if (s.attention_chunk_bytes > 0) rows = std::min(L, std::max<int64_t>(1, s.attention_chunk_bytes / row));
    bytes += static_cast<uint64_t>(kScoreTensors * rows * row);
  }
  return bytes;
}

int64_t tile_bytes(const VaeDecodeShape& s, const VaeTiles& t) {
  return t.sample_tile * t.sample_tile * s.vae.out_channels * s.dtype_bytes;
}

}  // namespace

int64_t VaeTiles::count(int64_t h, int64_t w) const {
  if (!applies(h, w)) return 1;
  return ((h + stride - 1) / stride) * ((w + stride - 1) / stride);
}

VaeTiles vae_tiles(const io::VaeConfig& v) {
  VaeTiles t;
  t.sample_tile = v.sample_size;
  t.latent_tile = static_cast<int64_t>(static_cast<double>(v.sample_size) / static_cast<double>(v.scale_factor()));
  t.stride = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(t.latent_tile) * (1.0 - kVaeTileOverlap)));
  return t;
}

uint64_t vae_decode_activation_bytes(const VaeDecodeShape& s, bool tiled) {
  int64_t h = s.latent_height, w = s.latent_width;
  const VaeTiles t = vae_tiles(s.vae);
  if (!tiled || !t.applies(h, w)) return decoder_pass_bytes(s, h, w);
  // Tiled, a pass covers one tile, and the decoded tiles of two rows and the output image stay.
  const int64_t cols = (w + t.stride - 1) / t.stride;
  const int64_t scale = s.vae.scale_factor();
  const int64_t image = h * w * scale * scale * s.vae.out_channels * s.dtype_bytes;
  const uint64_t kept = static_cast<uint64_t>((2 * cols + 1) * tile_bytes(s, t) + 2 * image) * static_cast<uint64_t>(s.batch);
  return decoder_pass_bytes(s, std::min(h, t.latent_tile), std::min(w, t.latent_tile)) + kept;
}

uint64_t vae_helper_activation_bytes(const VaeDecodeShape& s, int64_t kept_tiles) {
  const VaeTiles t = vae_tiles(s.vae);
  const int64_t latents = s.vae.latent_channels * s.latent_height * s.latent_width * s.dtype_bytes;
  const uint64_t kept = static_cast<uint64_t>(kept_tiles * tile_bytes(s, t) + latents) * static_cast<uint64_t>(s.batch);
  return decoder_pass_bytes(s, std::min(s.latent_height, t.latent_tile), std::min(s.latent_width, t.latent_tile)) + kept;
}

DecodePlan plan_decode(const VaeDecodeShape& shape, bool tiled, int world_size, uint64_t helper_fixed_bytes,
                       const std::map<int, uint64_t>& budgets) {
  DecodePlan plan;
  const VaeTiles t = vae_tiles(shape.vae);
  plan.tiles = t.count(shape.latent_height, shape.latent_width);
  if (!tiled || plan.tiles <= 1 || world_size <= 1) return plan;
  auto stage = [&](int64_t ranks) {
    return helper_fixed_bytes + vae_helper_activation_bytes(shape, (plan.tiles + ranks - 1) / ranks);
  };
  // The first ranks after the leader, as many as there are tiles for; fewer helpers give each a
  // larger share of a pass, so a rank over budget stays out once dropped.
  for (;;) {
    std::vector<int> helpers;
    for (int r = 1; r < world_size && static_cast<int64_t>(helpers.size()) + 1 < plan.tiles; ++r)
      if (plan.left_out.count(r) == 0) helpers.push_back(r);
    const int64_t n = 1 + static_cast<int64_t>(helpers.size());
    bool dropped = false;
    for (int r : helpers) {
      auto it = budgets.find(r);
      if (it != budgets.end() && stage(n) > it->second) {
        plan.left_out[r] = stage(n);
        dropped = true;
      }
    }
    if (dropped) continue;
    for (int r : helpers) {
      plan.ranks.push_back(r);
      plan.helper_bytes[r] = stage(n);
    }
    break;
  }
  return plan;
}

std::string DecodePlan::describe(const std::map<int, uint64_t>& budgets) const {
  if (!spread()) return "";
  std::string helpers;
  for (const auto& [rank, bytes] : helper_bytes) helpers += str_cat(helpers.empty() ? "" : ", ", "rank ", rank, " ", format_bytes(bytes));
  std::string s = str_cat("decode: ", tiles, " VAE tiles a pass, round robin over ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) s += str_cat(i ? "," : "", ranks[i]);
  s += str_cat("; the helpers load the VAE decoder once their blocks are done and freed (decode stage: ", helpers, ")");
  for (const auto& [rank, bytes] : left_out) {
    auto it = budgets.find(rank);
    s += str_cat("; rank ", rank, " left out (", format_bytes(bytes), " > its budget ",
                 it == budgets.end() ? std::string("-") : format_bytes(it->second), ")");
  }
  return s + "\n";
}

}  // namespace fluxmpi::parallel
