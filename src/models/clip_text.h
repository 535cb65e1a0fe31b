#pragma once
/// The CLIP text encoder of FLUX (`text_encoder/`), with the semantics of transformers
/// CLIPTextModel: token + position embeddings, pre-LayerNorm encoder layers with causal
/// self-attention, a final LayerNorm, and the pooled output taken at the first EOS token.
/// Parameter names are the transformers keys (`text_model.encoder.layers.0.self_attn.q_proj.weight`).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "io/configs.h"
#include "io/model_dir.h"
#include "io/tensor_store.h"
#include "models/common/layers.h"
#include "models/common/loader.h"
#include "models/text_encoder_common.h"

namespace fluxmpi::text_models {

/// Token embedding plus learned absolute position embedding.
class ClipTextEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit ClipTextEmbeddingsImpl(const io::ClipTextConfig& config);
  /// ids: [B, L] int64, L <= max_position_embeddings -> [B, L, D].
  at::Tensor forward(const at::Tensor& ids) const;

  nn::Embedding token_embedding{nullptr};
  nn::Embedding position_embedding{nullptr};
};
TORCH_MODULE(ClipTextEmbeddings);

/// The shape of one pre-LayerNorm encoder layer of the CLIP family (transformers' CLIPEncoderLayer,
/// which SigLIP's vision tower copies): CLIP's text model attends causally, SigLIP's vision model
/// does not.
struct ClipLayerOptions {
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  Activation act = Activation::QuickGelu;
  double layer_norm_eps = 1e-5;
  bool causal = true;
};
/// The CLIP text model's layers (causal, its config's activation and eps).
ClipLayerOptions clip_text_layer_options(const io::ClipTextConfig& config);

/// Multi-head self-attention with biased q/k/v/out projections (scale head_dim^-0.5), causal or not.
class ClipAttentionImpl : public torch::nn::Module {
 public:
  explicit ClipAttentionImpl(const ClipLayerOptions& options);
  /// x: [B, L, D] -> [B, L, D].
  at::Tensor forward(const at::Tensor& x) const;

  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  int64_t heads;
  bool causal;
};
TORCH_MODULE(ClipAttention);

/// fc1 -> activation -> fc2.
class ClipMlpImpl : public torch::nn::Module {
 public:
  explicit ClipMlpImpl(const ClipLayerOptions& options);
  /// x: [B, L, D] -> [B, L, D].
  at::Tensor forward(const at::Tensor& x) const;

  nn::Linear fc1{nullptr}, fc2{nullptr};
  Activation act;
};
TORCH_MODULE(ClipMlp);

/// x + attn(ln1(x)), then x + mlp(ln2(x)).
class ClipEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit ClipEncoderLayerImpl(const ClipLayerOptions& options);
  /// x: [B, L, D] -> [B, L, D].
  at::Tensor forward(const at::Tensor& x) const;

  ClipAttention self_attn{nullptr};
  nn::LayerNorm layer_norm1{nullptr};
  ClipMlp mlp{nullptr};
  nn::LayerNorm layer_norm2{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

/// The stack of encoder layers (`encoder.layers.N`).
class ClipEncoderImpl : public torch::nn::Module {
 public:
  ClipEncoderImpl(const ClipLayerOptions& options, int64_t num_layers);
  /// Typed handles of the modules registered in the `layers` list, in order.
  std::vector<ClipEncoderLayer> layers;

 private:
  torch::nn::ModuleList layer_list_{nullptr};
};
TORCH_MODULE(ClipEncoder);

/// transformers CLIPTextTransformer (`text_model.`).
class ClipTextTransformerImpl : public torch::nn::Module {
 public:
  explicit ClipTextTransformerImpl(const io::ClipTextConfig& config);

  ClipTextEmbeddings embeddings{nullptr};
  ClipEncoder encoder{nullptr};
  nn::LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(ClipTextTransformer);

struct ClipTextOutput {
  at::Tensor last_hidden_state;  ///< [B, L, D], after the final LayerNorm
  at::Tensor pooler_output;      ///< [B, D], last_hidden_state at the first EOS of each row
  /// Only with `trace`: the embeddings output and every layer's output (before the final
  /// LayerNorm), each [B, L, D].
  at::Tensor embeddings;
  std::vector<at::Tensor> layer_outputs;
};

class ClipTextModelImpl : public torch::nn::Module {
 public:
  explicit ClipTextModelImpl(const io::ClipTextConfig& config);
  /// ids: [B, L] integer token ids (L <= max_position_embeddings; FLUX uses 77). Runs under
  /// c10::InferenceMode on the device of the weights; outputs are in the run dtype.
  /// The outputs are inference tensors: copy (clone) before modifying one in place outside
  /// InferenceMode.
  ClipTextOutput forward(const at::Tensor& ids, bool trace = false) const;

  const io::ClipTextConfig& config() const { return config_; }
  ClipTextTransformer text_model{nullptr};

 private:
  io::ClipTextConfig config_;
};
TORCH_MODULE(ClipTextModel);

/// Position of the pooled token in each row of ids [B, L]: argmax(ids) when eos_token_id == 2
/// (transformers' rule for legacy configs, whose EOS is the largest id), else the first position
/// equal to eos_token_id (0 when a row has none, as transformers). Returns [B] int64.
at::Tensor clip_pool_positions(const at::Tensor& ids, int64_t eos_token_id);

/// Builds the model from `config` and loads it from `store` (keys `text_model.*`; the
/// `text_model.embeddings.position_ids` buffer, `text_projection.*` and `logit_scale` are ignored, every other
/// unclaimed key is a WeightError). `adjust` changes weights while they load (LoRA merges).
ClipTextModel load_clip_text_model(const io::ClipTextConfig& config, const io::TensorStore& store,
                                   at::ScalarType dtype, at::Device device, const nn::WeightAdjust& adjust = {});
/// The same from `dir`/text_encoder (config.json + weights).
ClipTextModel load_clip_text_model(const io::ModelDir& dir, at::ScalarType dtype, at::Device device);
/// What load_clip_text_model checks, from the safetensors headers alone (reads no tensor data):
/// every parameter stored with its shape, no unclaimed key. WeightError otherwise.
void check_clip_text_weights(const io::ClipTextConfig& config, const io::TensorStore& store);

}  // namespace fluxmpi::text_models
