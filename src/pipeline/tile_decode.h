#pragma once
/// The tiled VAE decode spread over the ranks of one pipeline (docs/architecture.md, "The decode"):
/// with tiling, the tiles of each decoder pass go round robin to the pipeline's decode ranks
/// (tile k to ranks[k % n], the leader first); each rank decodes its tiles, the helpers send
/// theirs to the leader, and the leader blends them in diffusers' order. Every tile is the same
/// decoder call on the same input as in the one-rank tiled loop (vae::run_tiled), so the image is
/// bit-identical to it, given equal --threads per rank.
///
/// `comm` is the ranks of this pipeline (the whole job without --stages) and its rank 0 is the
/// leader; the decode ranks are ranks of `comm`. Helpers take part after their transformer work for
/// the job is done: they load the VAE decoder when the first pass arrives.

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/vae/tiling.h"
#include "models/vae/vae_decoder.h"
#include "parallel/communicator.h"
#include "parallel/message.h"

namespace fluxmpi::pipeline {

/// The decode rank that decodes tile k of a pass: ranks[k % ranks.size()].
int tile_owner(size_t k, const std::vector<int>& ranks);

/// The leader's side, plugged into vae::DecodeOptions::tiles.
class TileDecodeLeader : public vae::TiledDecode {
 public:
  /// `ranks`: the decode ranks of `comm`, the leader (its rank 0) first; `dtype` and `device` are
  /// those of the decoder's output on every rank (the run's).
  TileDecodeLeader(const parallel::Communicator& comm, std::vector<int> ranks, at::ScalarType dtype, at::Device device);
  TileDecodeLeader(const TileDecodeLeader&) = delete;
  TileDecodeLeader& operator=(const TileDecodeLeader&) = delete;

  /// One tiled pass: z goes to every helper, the leader decodes its own tiles and receives the
  /// others' as blend_tiles asks for them, in order.
  at::Tensor decode(const vae::DecodeFn& decode, const at::Tensor& z, const vae::TileGeometry& geometry) override;
  /// Tells the helpers that no pass follows and waits for the sends. Once, after the last pass
  /// (also when there was none: the helpers are waiting).
  void finish();

  int64_t passes() const { return passes_; }
  /// Seconds the leader waited for helpers' tiles.
  double blocked_seconds() const { return messenger_.blocked_seconds(); }

 private:
  const parallel::Communicator& comm_;
  std::vector<int> ranks_;
  at::ScalarType dtype_;
  at::Device device_;
  parallel::Messenger messenger_;
  int64_t passes_ = 0;
  bool finished_ = false;
};

/// What a helper decodes with, made when the first pass arrives.
struct TileDecoder {
  vae::DecodeFn decode;         ///< one decoder call on one tile
  vae::TileGeometry geometry;   ///< the decoder's tile geometry (equal to the leader's)
};

/// The tile decoder of a loaded VAE decoder, which its calls keep alive.
TileDecoder tile_decoder_of(std::shared_ptr<vae::VaeDecoder> decoder);

/// A helper's side (a decode rank other than the leader): receives pass after pass from the leader
/// until it says no more, decodes its tiles of each (the decoder comes from `load`, called once,
/// at the first pass) and sends them back. Returns the tiles it decoded.
int64_t help_tile_decode(const parallel::Communicator& comm, const std::vector<int>& ranks,
                         const std::function<TileDecoder()>& load, at::Device device);

}  // namespace fluxmpi::pipeline
