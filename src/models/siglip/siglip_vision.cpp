// Semantics of transformers SiglipVisionModel (vision tower without the pooling head): patch
// convolution + position table, pre-LN encoder layers with bidirectional attention, final
// LayerNorm; the encoder layers are CLIP's (models/clip_text.h) without the causal mask.

#include "models/siglip/siglip_vision.h"

#include <c10/core/InferenceMode.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/error.h"
#include "models/common/cpu_linear.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::siglip {

text_models::Activation siglip_activation(const std::string& name) {
  // transformers' PytorchGELUTanh: torch's gelu(approximate="tanh").
  if (name == "gelu_pytorch_tanh") return text_models::Activation::GeluTanh;
  return text_models::parse_activation(name, "image_encoder/config.json 'hidden_act'");
}

SiglipPatchEmbeddingImpl::SiglipPatchEmbeddingImpl(int64_t channels, int64_t dim, int64_t patch_) : patch(patch_) {
  weight = register_parameter("weight", nn::placeholder({dim, channels, patch, patch}), false);
  bias = register_parameter("bias", nn::placeholder({dim}), false);
}

at::Tensor SiglipPatchEmbeddingImpl::forward(const at::Tensor& pixels) const {
  return nn::conv2d(pixels, weight, bias, /*stride=*/{patch, patch}, /*padding=*/{0, 0});
}

SiglipVisionEmbeddingsImpl::SiglipVisionEmbeddingsImpl(const io::SiglipVisionConfig& c) {
  patch_embedding =
      register_module("patch_embedding", SiglipPatchEmbedding(c.num_channels, c.hidden_size, c.patch_size));
  position_embedding = register_module("position_embedding", nn::Embedding(c.num_positions(), c.hidden_size));
}

at::Tensor SiglipVisionEmbeddingsImpl::forward(const at::Tensor& pixels) const {
  // pixels: [B, C, H, W] -> patches [B, D, h, w] -> [B, h*w, D]
  at::Tensor x = patch_embedding->forward(pixels).flatten(2).transpose(1, 2);
  const int64_t L = x.size(1), positions = position_embedding->weight.size(0);
  if (L != positions)
    throw ConfigError(str_cat("SigLIP image encoder: a ", pixels.size(2), "x", pixels.size(3), " input gives ", L,
                              " patches, but the position table has ", positions,
                              " rows (feature_extractor size and image_encoder image_size disagree)"));
  return x + position_embedding->weight;
}

text_models::ClipLayerOptions siglip_layer_options(const io::SiglipVisionConfig& c) {
  return {c.hidden_size, c.num_attention_heads, c.intermediate_size, siglip_activation(c.hidden_act), c.layer_norm_eps,
          /*causal=*/false};
}

SiglipVisionTransformerImpl::SiglipVisionTransformerImpl(const io::SiglipVisionConfig& c) {
  embeddings = register_module("embeddings", SiglipVisionEmbeddings(c));
  encoder = register_module("encoder", text_models::ClipEncoder(siglip_layer_options(c), c.num_hidden_layers));
  post_layernorm = register_module("post_layernorm", nn::LayerNorm(c.hidden_size, c.layer_norm_eps, true));
}

SiglipVisionModelImpl::SiglipVisionModelImpl(const io::SiglipVisionConfig& c) : config_(c) {
  vision_model = register_module("vision_model", SiglipVisionTransformer(c));
}

SiglipVisionOutput SiglipVisionModelImpl::forward(const at::Tensor& pixels, bool trace) const {
  // pixels: [B, C, H, W] -> last_hidden_state [B, L, D]
  c10::InferenceMode inference;
  nn::check_shape(pixels, {-1, config_.num_channels, -1, -1}, "SigLIP pixel values [B, C, H, W]");
  const SiglipVisionTransformerImpl& vm = *vision_model;
  const at::Tensor& w = vm.embeddings->patch_embedding->weight;
  FLUX_CHECK_AS(ConfigError, pixels.size(2) >= config_.patch_size && pixels.size(3) >= config_.patch_size,
                "SigLIP image encoder: a ", pixels.size(2), "x", pixels.size(3), " input is smaller than one ",
                config_.patch_size, "-pixel patch");
  SiglipVisionOutput out;
  at::Tensor x = vm.embeddings->forward(pixels.to(w.device(), w.scalar_type()));
  if (trace) out.embeddings = x;
  for (const auto& layer : vm.encoder->layers) {
    x = layer->forward(x);
    if (trace) out.layer_outputs.push_back(x);
  }
  out.last_hidden_state = vm.post_layernorm->forward(x);
  return out;
}

namespace {

nn::LoadRules siglip_load_rules() {
  nn::LoadRules rules;
  // SiglipMultiheadAttentionPoolingHead (Redux reads last_hidden_state) and the position_ids
  // buffer that older transformers saved.
  rules.skip_prefixes = {"vision_model.head.", "vision_model.embeddings.position_ids"};
  return rules;
}

}  // namespace

void check_siglip_vision_weights(const io::SiglipVisionConfig& config, const io::TensorStore& store) {
  SiglipVisionModel model(config);
  nn::check_module(*model, store, siglip_load_rules());
}

SiglipVisionModel load_siglip_vision_model(const io::SiglipVisionConfig& config, const io::TensorStore& store,
                                           at::ScalarType dtype, at::Device device) {
  SiglipVisionModel model(config);
  nn::load_module(*model, store, siglip_load_rules(), dtype, device);
  // fp32 on the CPU: the weights as oneDNN's GEMM reads them (cpu_linear.h), a layer at a time.
  // glibc keeps the replaced copies in its heap (5-20 MB blocks under its grown mmap threshold)
  // and would reach twice the weights; given back after each layer, the peak stays one layer above.
  for (text_models::ClipEncoderLayer layer : model->vision_model->encoder->layers) {
    nn::use_gemm_layout(*layer);
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }
  return model;
}

}  // namespace fluxmpi::siglip
