#pragma once
/// FluxTransformer2DModel (diffusers) built for a contiguous range of its blocks, with or without
/// the input embedders and the final layer: the whole model in one process, or the slice one MPI
/// rank owns. Blocks are numbered 0..B-1 in execution order (num_layers double-stream blocks, then
/// num_single_layers single-stream blocks) and keep their global diffusers names
/// (transformer_blocks.10.*, single_transformer_blocks.3.*) whatever slice is built.

#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

#include "io/configs.h"
#include "io/model_dir.h"
#include "models/common/loader.h"
#include "models/flux/double_block.h"
#include "models/flux/embeddings.h"
#include "models/flux/rope.h"
#include "models/flux/single_block.h"
#include "models/flux/stage_model.h"

namespace fluxmpi::flux {

/// The part of the transformer a process holds.
struct TransformerPart {
  int64_t first_block = 0;  ///< global index of the first block held
  int64_t end_block = 0;    ///< one past the last block held
  bool embedders = true;    ///< x_embedder, context_embedder, time_text_embed (rank 0)
  bool final_layer = true;  ///< norm_out, proj_out (last rank)

  static TransformerPart whole(const io::TransformerConfig& config);
  int64_t num_blocks() const { return end_block - first_block; }
};

class FluxTransformerImpl : public torch::nn::Module, public StageModel {
 public:
  FluxTransformerImpl(const io::TransformerConfig& config, const TransformerPart& part);

  /// Embedders: latents, text, timestep (x1000), guidance (x1000), pooled -> streams and temb.
  StreamState embed(const TransformerInputs& in) const override;
  /// zeros [S, 3], and (0, row, col) rows (flux/latents.h).
  at::Tensor text_position_ids(int64_t text_tokens) const override;
  at::Tensor image_position_ids(int64_t latent_height, int64_t latent_width) const override;
  /// Kontext's reference (index 0 only): rows (1, row, col).
  at::Tensor reference_position_ids(int64_t index, int64_t latent_height, int64_t latent_width) const override;
  /// The RoPE tables of the joint sequence cat(txt_ids, img_ids) ([S, 3], [L, 3]).
  RopeTables rope(const at::Tensor& txt_ids, const at::Tensor& img_ids) const override;
  /// Runs the blocks this part holds, in order, switching to the joint stream at the first
  /// single block. With `kv` (patch pipelining: one cache per block held, in order; see
  /// kv_caches) the state is a window of the sequence and `rope` holds the window's rows. With
  /// `residuals` (ControlNet samples; one entry per block held) each block's entry is added to its
  /// image tokens, as FluxTransformer2DModel adds controlnet_(single_)block_samples.
  void run_blocks(StreamState& state, const RopeTables& rope, const BlockObserver& observe = {},
                  std::vector<KvCache>* kv = nullptr, const BlockResiduals* residuals = nullptr) const override;
  /// One key/value cache per block held, each [batch, tokens, heads, head_dim] (uninitialised).
  std::vector<KvCache> kv_caches(int64_t batch, int64_t tokens, const at::TensorOptions& options) const override;
  /// norm_out + proj_out on the image tokens -> [B, L, out_channels].
  at::Tensor final_layer(const StreamState& state, at::Tensor* normed = nullptr) const override;
  int64_t stream_dim() const override { return config_.inner_dim(); }
  int64_t output_channels() const override { return config_.out_channels; }
  /// The whole model (a part holding everything): the noise prediction [B, L, out_channels].
  at::Tensor forward(const TransformerInputs& in, const at::Tensor& txt_ids, const at::Tensor& img_ids) const;

  /// Fuses the projections that read the same input (after loading).
  void fuse_projections();
  /// Whether a weight key belongs to this part (the loader reports unclaimed owned keys).
  bool owns_key(const std::string& key) const;

  const io::TransformerConfig& config() const { return config_; }
  const TransformerPart& part() const { return part_; }

  nn::Linear x_embedder{nullptr}, context_embedder{nullptr};
  TimeTextEmbed time_text_embed{nullptr};
  std::vector<DoubleBlock> double_blocks;  ///< registered as transformer_blocks.<global index>
  std::vector<SingleBlock> single_blocks;  ///< registered as single_transformer_blocks.<index>
  AdaNorm norm_out{nullptr};
  nn::Linear proj_out{nullptr};

 private:
  io::TransformerConfig config_;
  TransformerPart part_;
  int64_t first_double_ = 0, first_single_ = 0;  ///< diffusers indices of the first block held
};
TORCH_MODULE(FluxTransformer);

/// Builds the part and loads its weights from `dir`/transformer (reading only the shards that
/// hold them), then fuses projections. `adjust` changes weights while they load (LoRA merges, before
/// the projections are fused).
FluxTransformer load_flux_transformer(const io::ModelDir& dir, const TransformerPart& part, at::ScalarType dtype,
                                      at::Device device, nn::LoadStats* stats = nullptr,
                                      const nn::WeightAdjust& adjust = {});

}  // namespace fluxmpi::flux
