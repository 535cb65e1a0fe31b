#pragma once
/// FluxControlNetModel (diffusers): embedders and blocks like the transformer's, whose image-stream
/// outputs, each through its own zero-initialised linear (controlnet_blocks.<i>,
/// controlnet_single_blocks.<j>) and times the conditioning scale, are the residual samples that
/// FluxTransformer2DModel adds to its blocks' image tokens (io::ResidualLayout says which block takes
/// which sample). Semantics of diffusers FluxControlNetModel and ControlNetConditioningEmbedding.
///
/// The control image enters as controlnet_x_embedder(cond) added to x_embedder(latents): cond is the
/// packed VAE latents of the control image (InstantX, Union layouts), or input_hint_block's output
/// cut into patch_size^2 patches (XLabs layout). It does not change over the steps, so it is
/// embedded once per image (embed_condition) and each call adds its rows. A Union model prepends
/// controlnet_mode_embedder(mode) to the text tokens (and one more text position id).
///
/// With patch pipelining the calls are windows of the sequence with one key/value cache per block,
/// as the transformer's (flux::KvCache); the mode token travels with the text (the first patch).

#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "io/controlnet_config.h"
#include "models/common/layers.h"
#include "models/common/loader.h"
#include "models/flux/double_block.h"
#include "models/flux/embeddings.h"
#include "models/flux/rope.h"
#include "models/flux/single_block.h"
#include "models/flux/stage_model.h"

namespace fluxmpi::flux {

/// A 3x3 convolution with padding 1 and a stride (input_hint_block's layers).
class StridedConvImpl : public torch::nn::Module {
 public:
  StridedConvImpl(int64_t in_channels, int64_t out_channels, int64_t stride);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  int64_t stride;
};
TORCH_MODULE(StridedConv);

/// input_hint_block: ControlNetConditioningEmbedding(conditioning_embedding_channels,
/// block_out_channels=(16, 16, 16, 16)): conv_in, then per level a convolution and a strided one,
/// SiLU after each, conv_out. [B, 3, H, W] -> [B, channels, H / 8, W / 8].
class HintEmbeddingImpl : public torch::nn::Module {
 public:
  explicit HintEmbeddingImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& pixels) const;
  StridedConv conv_in{nullptr}, conv_out{nullptr};
  std::vector<StridedConv> blocks;  ///< registered as blocks.<i>
};
TORCH_MODULE(HintEmbedding);

/// One ControlNet call's inputs (rows of a window with patch pipelining).
struct ControlNetInputs {
  at::Tensor latents;    ///< [B, L, in_channels] packed latents
  at::Tensor condition;  ///< [B, L, D] the same rows of embed_condition()
  at::Tensor mode;       ///< [B] int64 control mode (Union models; else undefined)
  at::Tensor text;       ///< [B, S, joint_attention_dim] (S = 0: a patch without the text)
  at::Tensor pooled;     ///< [B, pooled_projection_dim]
  at::Tensor timestep;   ///< [B] sigma (= t / 1000)
  at::Tensor guidance;   ///< [B] guidance scale (config.guidance_embeds only)
};

class FluxControlNetImpl : public torch::nn::Module {
 public:
  explicit FluxControlNetImpl(const io::ControlNetConfig& config);

  /// controlnet_x_embedder of the control image, [B, L, D]: `control` is the packed latents
  /// [B, L, in_channels], or for the XLabs layout the preprocessed pixels [B, 3, H, W].
  at::Tensor embed_condition(const at::Tensor& control) const;
  /// The embedders: image tokens x_embedder(latents) + condition, temb, the text tokens with the
  /// mode token first (Union, when the call carries the text). StreamState::text_len counts it.
  StreamState embed(const ControlNetInputs& in) const;
  /// RoPE tables of cat(txt_ids, img_ids); a Union model repeats the first text id for its mode token.
  RopeTables rope(const at::Tensor& txt_ids, const at::Tensor& img_ids) const;
  /// Runs every block on `state` and returns the residual samples, scaled: one per double block,
  /// then one per single block, each the image tokens' rows [B, L, D]. With `kv` (one cache per
  /// block, see kv_caches) the state is a window and `rope` holds its rows.
  std::vector<at::Tensor> run_blocks(StreamState& state, const RopeTables& rope, double scale,
                                     std::vector<KvCache>* kv = nullptr, const BlockObserver& observe = {}) const;
  /// One key/value cache per block, each [batch, tokens, heads, head_dim] (uninitialised).
  std::vector<KvCache> kv_caches(int64_t batch, int64_t tokens, const at::TensorOptions& options) const;

  /// Fuses the projections that read the same input (after loading).
  void fuse_projections();
  const io::ControlNetConfig& config() const { return config_; }

  nn::Linear x_embedder{nullptr}, context_embedder{nullptr}, controlnet_x_embedder{nullptr};
  TimeTextEmbed time_text_embed{nullptr};
  std::vector<DoubleBlock> double_blocks;      ///< transformer_blocks.<i>
  std::vector<SingleBlock> single_blocks;      ///< single_transformer_blocks.<j>
  std::vector<nn::Linear> controlnet_blocks;   ///< controlnet_blocks.<i>
  std::vector<nn::Linear> controlnet_single_blocks;  ///< controlnet_single_blocks.<j>
  nn::Embedding controlnet_mode_embedder{nullptr};   ///< Union only
  HintEmbedding input_hint_block{nullptr};           ///< XLabs layout only

 private:
  io::ControlNetConfig config_;
};
TORCH_MODULE(FluxControlNet);

/// The config of the ControlNet folder `dir` (config.json; ConfigError naming it).
io::ControlNetConfig read_controlnet_config(const std::string& dir);
/// Checks the weight headers of `dir` against the module its config builds (every parameter stored
/// with its shape, no key unclaimed), reading no tensor data. WeightError naming key and file.
void check_controlnet_weights(const std::string& dir);
/// Builds the ControlNet of folder `dir` (config.json + safetensors weights, sharded or not), loads
/// it in `dtype` on `device` and fuses its projections.
FluxControlNet load_flux_controlnet(const std::string& dir, at::ScalarType dtype, at::Device device,
                                    nn::LoadStats* stats = nullptr);

}  // namespace fluxmpi::flux
