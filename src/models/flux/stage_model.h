#pragma once
/// What the step loop (pipeline/denoise.h) needs of the transformer part one rank holds, whatever
/// the model family: FLUX.1 (flux::FluxTransformerImpl) and FLUX.2 (flux2::Flux2TransformerImpl)
/// both run double-stream blocks, then single-stream blocks on the joint sequence [text; image], so
/// the messages between ranks, the micro-batches and the patch pipelining are the same code for
/// both; only what a part computes differs.

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "models/flux/attention.h"
#include "models/flux/rope.h"

namespace fluxmpi::flux {

/// Inputs of a transformer call, as the pipelines pass them.
struct TransformerInputs {
  at::Tensor latents;   ///< [B, L, in_channels] packed latents
  at::Tensor text;      ///< [B, S, joint_attention_dim] text-encoder states
  at::Tensor pooled;    ///< [B, pooled_projection_dim] CLIP pooled output (FLUX.1 only)
  at::Tensor timestep;  ///< [B] sigma (= t / 1000), in the run dtype
  at::Tensor guidance;  ///< [B] guidance scale (guidance-distilled models only; else undefined)
};

/// Activations travelling through the blocks: the text and image streams inside the double
/// blocks, the joint stream [text; image] once the single blocks start, and temb throughout.
struct StreamState {
  at::Tensor txt;    ///< [B, S, D] (double-block phase)
  at::Tensor img;    ///< [B, L, D] (double-block phase)
  at::Tensor joint;  ///< [B, S+L, D] (single-block phase)
  at::Tensor temb;   ///< [B, D]
  /// FLUX.2: the modulation vectors every block reads ([B, modulation_dim()]), computed once per
  /// forward by the part holding the embedders and sent along with the streams; undefined for FLUX.1.
  at::Tensor modulation;
  int64_t text_len = 0;

  bool is_joint() const { return joint.defined(); }
};

/// Called after every block with its name ("double_block_3", "single_block_0"): for tests, and for
/// the step loop's warm-up on a waiting rank, which stops by throwing from it (pipeline/denoise.cpp).
using BlockObserver = std::function<void(const std::string& name, const StreamState& state)>;

/// Residuals added to the image tokens after blocks (ControlNet samples, models/flux/controlnet.h):
/// one entry per block held, in order, [B, L, D] over the state's image tokens (a window's rows
/// with patch pipelining); an undefined entry adds nothing.
using BlockResiduals = std::vector<at::Tensor>;

class StageModel {
 public:
  virtual ~StageModel() = default;

  /// Embedders (part with embedders only): inputs -> streams, temb (and modulation).
  virtual StreamState embed(const TransformerInputs& in) const = 0;
  /// Position ids of the text tokens [S, n_axes] and of an h x w latent's image tokens [L, n_axes].
  virtual at::Tensor text_position_ids(int64_t text_tokens) const = 0;
  virtual at::Tensor image_position_ids(int64_t latent_height, int64_t latent_width) const = 0;
  /// Position ids of reference image `index` (0-based; an h x w latent) whose tokens follow the image
  /// tokens in the sequence [L_ref, n_axes]: Kontext's one reference (1, row, col), FLUX.2's references
  /// (10 + 10 index, row, col, 0).
  virtual at::Tensor reference_position_ids(int64_t index, int64_t latent_height, int64_t latent_width) const = 0;
  /// The RoPE tables of the joint sequence cat(txt_ids, img_ids).
  virtual RopeTables rope(const at::Tensor& txt_ids, const at::Tensor& img_ids) const = 0;
  /// Runs the blocks this part holds, in order, switching to the joint stream at the first
  /// single block. With `kv` (patch pipelining: one cache per block held, in order; see
  /// kv_caches) the state is a window of the sequence and `rope` holds the window's rows. With
  /// `residuals` (FLUX.1 only) each block's entry is added to its output's image tokens.
  virtual void run_blocks(StreamState& state, const RopeTables& rope, const BlockObserver& observe = {},
                          std::vector<KvCache>* kv = nullptr, const BlockResiduals* residuals = nullptr) const = 0;
  /// One key/value cache per block held, each [batch, tokens, heads, head_dim] (uninitialised).
  virtual std::vector<KvCache> kv_caches(int64_t batch, int64_t tokens, const at::TensorOptions& options) const = 0;
  /// Final norm + projection on the image tokens (last part only) -> [B, L, output_channels()].
  virtual at::Tensor final_layer(const StreamState& state, at::Tensor* normed = nullptr) const = 0;

  /// D, the width of the streams.
  virtual int64_t stream_dim() const = 0;
  /// The noise prediction's channels.
  virtual int64_t output_channels() const = 0;
  /// Width of StreamState::modulation (0: the family sends none).
  virtual int64_t modulation_dim() const { return 0; }
};

}  // namespace fluxmpi::flux
