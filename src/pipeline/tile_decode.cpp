#include "pipeline/tile_decode.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "core/error.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::pipeline {
namespace {

using parallel::MessageKind;
using parallel::MessageTag;

// Latents of pass p; pass p with an empty batch ends the decode.
MessageTag latents_tag(int64_t pass) { return MessageTag{MessageKind::DecodeLatents, pass, 0, 0, -1}; }
MessageTag tile_tag(int64_t pass, size_t k) {
  return MessageTag{MessageKind::DecodedTile, pass, static_cast<int64_t>(k), 0, -1};
}

std::vector<vae::Tile> grid_of(const at::Tensor& z, const vae::TileGeometry& g) {
  return vae::tile_grid(z.size(2), z.size(3), g.latent_tile, g.latent_stride());
}

}  // namespace

int tile_owner(size_t k, const std::vector<int>& ranks) {
  FLUX_CHECK(!ranks.empty(), "no decode ranks");
  return ranks[k % ranks.size()];
}

TileDecodeLeader::TileDecodeLeader(const parallel::Communicator& comm, std::vector<int> ranks, at::ScalarType dtype,
                                   at::Device device)
    : comm_(comm), ranks_(std::move(ranks)), dtype_(dtype), device_(device), messenger_(comm) {
  FLUX_CHECK(ranks_.size() >= 2 && ranks_.front() == comm.rank(), "a spread decode needs the leader and a helper");
}

at::Tensor TileDecodeLeader::decode(const vae::DecodeFn& decode, const at::Tensor& z, const vae::TileGeometry& geometry) {
  // z: [B, latent_channels, h, w]
  FLUX_CHECK(!finished_, "a tiled pass after the decode was finished");
  FLUX_CHECK(z.dim() == 4 && z.size(0) > 0, "VAE latents must be [B, C, h, w], got ", nn::shape_string(z.sizes()));
  const int64_t pass = passes_++;
  const at::Tensor input = z.contiguous();
  for (size_t i = 1; i < ranks_.size(); ++i) messenger_.send(ranks_[i], latents_tag(pass), {input});
  const std::vector<vae::Tile> grid = grid_of(input, geometry);
  const int me = comm_.rank();
  auto output = [&](size_t k) -> at::Tensor {
    const int owner = tile_owner(k, ranks_);
    if (owner == me) return decode(vae::tile_input(input, grid[k]));
    const vae::Tile& t = grid[k];
    parallel::MessageHeader expected;
    expected.tag = tile_tag(pass, k);
    expected.tensors.push_back(parallel::TensorSpec{
        dtype_, {input.size(0), geometry.out_channels, t.height * geometry.scale, t.width * geometry.scale}});
    return messenger_.recv(owner, expected, device_).front();
  };
  at::Tensor image = vae::blend_tiles(output, grid, geometry.blend_extent(), geometry.row_limit());
  messenger_.wait_all();  // z was read by every helper
  return image;
}

void TileDecodeLeader::finish() {
  if (finished_) return;
  finished_ = true;
  const at::Tensor none = at::empty({0, 1, 1, 1}, at::TensorOptions().dtype(dtype_));
  for (size_t i = 1; i < ranks_.size(); ++i) messenger_.send(ranks_[i], latents_tag(passes_), {none});
  messenger_.wait_all();
}

TileDecoder tile_decoder_of(std::shared_ptr<vae::VaeDecoder> decoder) {
  TileDecoder d;
  d.geometry = vae::tile_geometry((*decoder)->config());
  d.decode = [decoder](const at::Tensor& z) { return (*decoder)->forward(z); };
  return d;
}

int64_t help_tile_decode(const parallel::Communicator& comm, const std::vector<int>& ranks,
                         const std::function<TileDecoder()>& load, at::Device device) {
  const int me = comm.rank(), leader = ranks.front();
  FLUX_CHECK(std::find(ranks.begin() + 1, ranks.end(), me) != ranks.end(), "rank ", me, " is no decode helper");
  c10::InferenceMode guard;
  parallel::Messenger messenger(comm);
  std::optional<TileDecoder> decoder;
  int64_t tiles = 0;
  for (int64_t pass = 0;; ++pass) {
    std::vector<at::Tensor> got = messenger.recv_any_shape(leader, latents_tag(pass), device);
    if (got.size() != 1 || got[0].dim() != 4)
      throw CommError(str_cat("rank ", me, " expected one [B, C, h, w] tensor of VAE latents from rank ", leader,
                              " for decode pass ", pass, ", got ", got.size(), " tensor(s)",
                              got.empty() ? "" : str_cat(" of shape ", nn::shape_string(got[0].sizes()))));
    const at::Tensor& z = got[0];
    if (z.size(0) == 0) break;
    if (!decoder) decoder.emplace(load());
    const std::vector<vae::Tile> grid = grid_of(z, decoder->geometry);
    for (size_t k = 0; k < grid.size(); ++k) {
      if (tile_owner(k, ranks) != me) continue;
      messenger.send(leader, tile_tag(pass, k), {decoder->decode(vae::tile_input(z, grid[k])).contiguous()});
      ++tiles;
    }
  }
  messenger.wait_all();
  return tiles;
}

}  // namespace fluxmpi::pipeline
