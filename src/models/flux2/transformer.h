#pragma once
/// Flux2Transformer2DModel (diffusers) built for a contiguous range of its blocks, with or without
/// the input embedders and the final layer (flux::TransformerPart, as FLUX.1's): the whole model
/// in one process, or the slice one MPI rank owns, behind the step loop's flux::StageModel.
/// Blocks are numbered 0..B-1 in execution order (num_layers double-stream blocks, then
/// num_single_layers single-stream blocks) and keep their global diffusers names
/// (transformer_blocks.1.*, single_transformer_blocks.2.*) whatever slice is built.
///
/// The global modulation: FLUX.2's blocks read (shift, scale, gate) vectors that three linears
/// (double_stream_modulation_img, double_stream_modulation_txt, single_stream_modulation) compute
/// once per forward from temb. The part holding the embedders owns those linears too (at FLUX.2
/// [dev] size they are ~0.57 B parameters, which every rank would otherwise hold); embed() puts
/// the vectors, concatenated, in StreamState::modulation [B, modulation_dim()] =
///   [double img (6D) | double txt (6D) | single (3D)], each set ordered (shift, scale, gate),
/// and the other parts read their slices from it (the vectors are a few hundred KB per message;
/// the step loop sends them with the streams). temb travels as well: norm_out needs it. A part
/// without the embedders neither builds nor loads the modulation linears.
///
/// Position ids have 4 axes (T, H, W, L): text tokens (0, 0, 0, l), image tokens (0, row, col, 0),
/// reference image k's tokens (10 + 10 k, row, col, 0) (int64). RoPE is FLUX.1's (flux::rope_tables / apply_rope) with the config's axes and theta.

#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "models/common/loader.h"
#include "models/flux/stage_model.h"
#include "models/flux/transformer.h"
#include "models/flux2/config.h"
#include "models/flux2/double_block.h"
#include "models/flux2/embeddings.h"
#include "models/flux2/modulation.h"
#include "models/flux2/single_block.h"

namespace fluxmpi::flux2 {

using flux::TransformerPart;

/// The part holding every block, the embedders and the final layer.
TransformerPart whole_part(const TransformerConfig& config);

class Flux2TransformerImpl : public torch::nn::Module, public flux::StageModel {
 public:
  Flux2TransformerImpl(const TransformerConfig& config, const TransformerPart& part);

  /// Embedders: latents, text, timestep (x1000), guidance (x1000; used only by a model with a
  /// guidance embedder, required there) -> streams, temb and the modulation vectors. `pooled` is
  /// not used (FLUX.2 has no pooled text input).
  flux::StreamState embed(const flux::TransformerInputs& in) const override;
  /// [S, 4] rows (0, 0, 0, l), int64.
  at::Tensor text_position_ids(int64_t text_tokens) const override;
  /// [(h/2)(w/2), 4] rows (0, row, col, 0) row-major, int64, for an h x w VAE latent (as FLUX.1:
  /// h, w are twice the token grid; the step loop passes the same numbers to both families).
  at::Tensor image_position_ids(int64_t latent_height, int64_t latent_width) const override;
  /// Reference image `index` of a multi-reference call: rows (10 + 10 index, row, col, 0), int64
  /// (flux2::reference_ids).
  at::Tensor reference_position_ids(int64_t index, int64_t latent_height, int64_t latent_width) const override;
  /// The RoPE tables of cat(txt_ids, img_ids) ([S, 4], [L, 4]), float32 [S+L, head_dim].
  flux::RopeTables rope(const at::Tensor& txt_ids, const at::Tensor& img_ids) const override;
  /// Runs the blocks this part holds, in order, switching to the joint stream at the first
  /// single block; reads the modulation from `state`. With `kv` (patch pipelining: one cache per
  /// block held, in order; see kv_caches) the state is a window of the sequence and `rope` holds
  /// the window's rows.
  /// FLUX.2 takes no ControlNet residuals (`residuals` must be null).
  void run_blocks(flux::StreamState& state, const flux::RopeTables& rope, const flux::BlockObserver& observe = {},
                  std::vector<flux::KvCache>* kv = nullptr, const flux::BlockResiduals* residuals = nullptr) const override;
  /// One key/value cache per block held, each [batch, tokens, heads, head_dim] (uninitialised).
  std::vector<flux::KvCache> kv_caches(int64_t batch, int64_t tokens, const at::TensorOptions& options) const override;
  /// norm_out + proj_out on the image tokens -> [B, L, out_channels].
  at::Tensor final_layer(const flux::StreamState& state, at::Tensor* normed = nullptr) const override;
  int64_t stream_dim() const override { return config_.inner_dim(); }
  int64_t output_channels() const override { return config_.out_channels; }
  int64_t modulation_dim() const override { return config_.modulation_dim(); }

  /// The whole model (a part holding everything): the noise prediction [B, L, out_channels].
  at::Tensor forward(const flux::TransformerInputs& in, const at::Tensor& txt_ids, const at::Tensor& img_ids) const;

  /// Whether a weight key belongs to this part (the loader reports unclaimed owned keys).
  bool owns_key(const std::string& key) const;

  const TransformerConfig& config() const { return config_; }
  const TransformerPart& part() const { return part_; }

  // Embedders (part.embedders), with the global modulation.
  nn::Linear x_embedder{nullptr}, context_embedder{nullptr};
  TimeGuidanceEmbed time_guidance_embed{nullptr};
  Modulation double_stream_modulation_img{nullptr}, double_stream_modulation_txt{nullptr},
      single_stream_modulation{nullptr};
  std::vector<DoubleBlock> double_blocks;  ///< registered as transformer_blocks.<global index>
  std::vector<SingleBlock> single_blocks;  ///< registered as single_transformer_blocks.<index>
  // Final layer (part.final_layer).
  OutputNorm norm_out{nullptr};
  nn::Linear proj_out{nullptr};

 private:
  TransformerConfig config_;
  TransformerPart part_;
  int64_t first_double_ = 0, first_single_ = 0;  ///< diffusers indices of the first block held
};
TORCH_MODULE(Flux2Transformer);

/// Builds the part from `<transformer_dir>/config.json` (a Flux2Transformer2DModel config: a
/// FLUX.1 folder is refused by its _class_name) and loads its weights, reading only the shards
/// that hold them. Takes the transformer folder, not an io::ModelDir (which reads FLUX.1 pipeline
/// folders only).
Flux2Transformer load_flux2_transformer(const std::string& transformer_dir, const TransformerPart& part,
                                        at::ScalarType dtype, at::Device device, nn::LoadStats* stats = nullptr);
/// The same from any store presenting the diffusers keys: a folder's, or a single file's (a GGUF
/// or safetensors file in the original layout, io::ModelDir::open_weights).
Flux2Transformer load_flux2_transformer(const TransformerConfig& config, io::TensorStore store,
                                        const TransformerPart& part, at::ScalarType dtype, at::Device device,
                                        nn::LoadStats* stats = nullptr);

}  // namespace fluxmpi::flux2
