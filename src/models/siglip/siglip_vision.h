#pragma once
/// The SigLIP vision encoder of FLUX.1 Redux (`image_encoder/`), with the semantics of transformers
/// SiglipVisionModel: a patch convolution plus a learned position table, pre-LayerNorm encoder
/// layers with bidirectional self-attention and a tanh-GELU MLP, and a final LayerNorm
/// (`post_layernorm`). Redux reads last_hidden_state; the attention-pooling head
/// (`vision_model.head.*`) is never run, so its weights are skipped like the VAE encoder's.
/// Parameter names are the transformers keys (`vision_model.encoder.layers.0.self_attn.q_proj.weight`).

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "io/redux_dir.h"
#include "io/tensor_store.h"
#include "models/common/layers.h"
#include "models/common/loader.h"
#include "models/clip_text.h"
#include "models/text_encoder_common.h"

namespace fluxmpi::siglip {

/// The config's hidden_act: "gelu_pytorch_tanh" (what SigLIP uses) or any activation the text
/// encoders know. ConfigError naming the file otherwise.
text_models::Activation siglip_activation(const std::string& name);

/// Conv2d(C, D, kernel = stride = patch, padding "valid"): one D-vector per whole patch; the
/// pixels right and below the last whole patch are not read.
class SiglipPatchEmbeddingImpl : public torch::nn::Module {
 public:
  SiglipPatchEmbeddingImpl(int64_t channels, int64_t dim, int64_t patch);
  /// pixels: [B, C, H, W] -> [B, D, H // p, W // p].
  at::Tensor forward(const at::Tensor& pixels) const;

  at::Tensor weight, bias;  ///< [D, C, p, p], [D]
  int64_t patch;
};
TORCH_MODULE(SiglipPatchEmbedding);

/// The patch embeddings, flattened row-major, plus the position table.
class SiglipVisionEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit SiglipVisionEmbeddingsImpl(const io::SiglipVisionConfig& config);
  /// pixels: [B, C, H, W] -> [B, L, D], L = (H // p) * (W // p), which must be the table's rows.
  at::Tensor forward(const at::Tensor& pixels) const;

  SiglipPatchEmbedding patch_embedding{nullptr};
  nn::Embedding position_embedding{nullptr};
};
TORCH_MODULE(SiglipVisionEmbeddings);

/// The encoder layers: transformers' SiglipEncoderLayer is a CLIPEncoderLayer without the causal
/// mask (same keys: self_attn.q_proj, layer_norm1, mlp.fc1, ...).
text_models::ClipLayerOptions siglip_layer_options(const io::SiglipVisionConfig& config);

/// transformers SiglipVisionTransformer (`vision_model.`) without its head.
class SiglipVisionTransformerImpl : public torch::nn::Module {
 public:
  explicit SiglipVisionTransformerImpl(const io::SiglipVisionConfig& config);

  SiglipVisionEmbeddings embeddings{nullptr};
  text_models::ClipEncoder encoder{nullptr};
  nn::LayerNorm post_layernorm{nullptr};
};
TORCH_MODULE(SiglipVisionTransformer);

struct SiglipVisionOutput {
  at::Tensor last_hidden_state;  ///< [B, L, D], after post_layernorm
  /// Only with `trace`: the embeddings and every layer's output, each [B, L, D].
  at::Tensor embeddings;
  std::vector<at::Tensor> layer_outputs;
};

class SiglipVisionModelImpl : public torch::nn::Module {
 public:
  explicit SiglipVisionModelImpl(const io::SiglipVisionConfig& config);
  /// pixels: [B, C, H, W] (the processor's output; any float dtype, converted to the weights').
  /// Runs under c10::InferenceMode on the device of the weights.
  SiglipVisionOutput forward(const at::Tensor& pixels, bool trace = false) const;

  const io::SiglipVisionConfig& config() const { return config_; }
  SiglipVisionTransformer vision_model{nullptr};

 private:
  io::SiglipVisionConfig config_;
};
TORCH_MODULE(SiglipVisionModel);

/// Builds the model and loads it from `store` (keys `vision_model.*`; the head and the
/// `position_ids` buffer of older checkpoints are skipped, any other unclaimed key is a WeightError).
SiglipVisionModel load_siglip_vision_model(const io::SiglipVisionConfig& config, const io::TensorStore& store,
                                           at::ScalarType dtype, at::Device device);
/// What load_siglip_vision_model checks, from the safetensors headers alone.
void check_siglip_vision_weights(const io::SiglipVisionConfig& config, const io::TensorStore& store);

}  // namespace fluxmpi::siglip
