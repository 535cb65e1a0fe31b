// Semantics of transformers CLIPTextModel (pre-LN transformer, causal self-attention, pooled
// output at the first EOS), written against nn::attention and the common layers.

#include "models/clip_text.h"

#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "models/common/attention.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::text_models {

ClipTextEmbeddingsImpl::ClipTextEmbeddingsImpl(const io::ClipTextConfig& c) {
  token_embedding = register_module("token_embedding", nn::Embedding(c.vocab_size, c.hidden_size));
  position_embedding = register_module("position_embedding", nn::Embedding(c.max_position_embeddings, c.hidden_size));
}

at::Tensor ClipTextEmbeddingsImpl::forward(const at::Tensor& ids) const {
  // ids: [B, L]; positions are 0..L-1, so the position table is read as a slice.
  const int64_t L = ids.size(1);
  return token_embedding->forward(ids) + position_embedding->weight.narrow(0, 0, L);
}

ClipLayerOptions clip_text_layer_options(const io::ClipTextConfig& c) {
  return {c.hidden_size, c.num_attention_heads, c.intermediate_size,
          parse_activation(c.hidden_act, "text_encoder/config.json 'hidden_act'"), c.layer_norm_eps, /*causal=*/true};
}

ClipAttentionImpl::ClipAttentionImpl(const ClipLayerOptions& o) : heads(o.num_attention_heads), causal(o.causal) {
  const int64_t D = o.hidden_size;
  k_proj = register_module("k_proj", nn::Linear(D, D));
  v_proj = register_module("v_proj", nn::Linear(D, D));
  q_proj = register_module("q_proj", nn::Linear(D, D));
  out_proj = register_module("out_proj", nn::Linear(D, D));
}

at::Tensor ClipAttentionImpl::forward(const at::Tensor& x) const {
  // x: [B, L, D] -> q, k, v: [B, H, L, Dh]
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2), Dh = D / heads;
  auto split = [&](const at::Tensor& t) { return t.view({B, L, heads, Dh}).transpose(1, 2); };
  at::Tensor o = nn::attention(split(q_proj->forward(x)), split(k_proj->forward(x)), split(v_proj->forward(x)), {},
                               std::nullopt, causal);
  return out_proj->forward(o.transpose(1, 2).reshape({B, L, D}));
}

ClipMlpImpl::ClipMlpImpl(const ClipLayerOptions& o) : act(o.act) {
  fc1 = register_module("fc1", nn::Linear(o.hidden_size, o.intermediate_size));
  fc2 = register_module("fc2", nn::Linear(o.intermediate_size, o.hidden_size));
}

at::Tensor ClipMlpImpl::forward(const at::Tensor& x) const { return fc2->forward(activate(act, fc1->forward(x))); }

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const ClipLayerOptions& o) {
  self_attn = register_module("self_attn", ClipAttention(o));
  layer_norm1 = register_module("layer_norm1", nn::LayerNorm(o.hidden_size, o.layer_norm_eps, true));
  mlp = register_module("mlp", ClipMlp(o));
  layer_norm2 = register_module("layer_norm2", nn::LayerNorm(o.hidden_size, o.layer_norm_eps, true));
}

at::Tensor ClipEncoderLayerImpl::forward(const at::Tensor& x) const {
  // x: [B, L, D]
  at::Tensor h = x + self_attn->forward(layer_norm1->forward(x));
  return h + mlp->forward(layer_norm2->forward(h));
}

ClipEncoderImpl::ClipEncoderImpl(const ClipLayerOptions& o, int64_t num_layers) {
  layer_list_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_layers; ++i) {
    layers.push_back(ClipEncoderLayer(o));
    layer_list_->push_back(layers.back());
  }
}

ClipTextTransformerImpl::ClipTextTransformerImpl(const io::ClipTextConfig& c) {
  embeddings = register_module("embeddings", ClipTextEmbeddings(c));
  encoder = register_module("encoder", ClipEncoder(clip_text_layer_options(c), c.num_hidden_layers));
  final_layer_norm = register_module("final_layer_norm", nn::LayerNorm(c.hidden_size, c.layer_norm_eps, true));
}

ClipTextModelImpl::ClipTextModelImpl(const io::ClipTextConfig& c) : config_(c) {
  text_model = register_module("text_model", ClipTextTransformer(c));
}

at::Tensor clip_pool_positions(const at::Tensor& ids, int64_t eos_token_id) {
  // ids: [B, L] -> [B]
  at::Tensor as_int = ids.to(at::kInt);
  if (eos_token_id == 2) return as_int.argmax(-1);
  return as_int.eq(eos_token_id).to(at::kInt).argmax(-1);
}

ClipTextOutput ClipTextModelImpl::forward(const at::Tensor& input_ids, bool trace) const {
  // input_ids: [B, L] -> last_hidden_state [B, L, D], pooler_output [B, D]
  c10::InferenceMode inference;
  nn::check_shape(input_ids, {-1, -1}, "CLIP text model input ids [B, L]");
  FLUX_CHECK(input_ids.size(1) >= 1 && input_ids.size(1) <= config_.max_position_embeddings,
             "CLIP input of ", input_ids.size(1), " tokens; the model has ", config_.max_position_embeddings,
             " positions");
  const ClipTextTransformerImpl& tm = *text_model;
  at::Tensor ids = input_ids.to(tm.embeddings->token_embedding->weight.device(), at::kLong);
  check_token_ids(ids, config_.vocab_size, "CLIP text model (text_encoder/config.json)");

  ClipTextOutput out;
  at::Tensor x = tm.embeddings->forward(ids);
  if (trace) out.embeddings = x;
  for (const auto& layer : tm.encoder->layers) {
    x = layer->forward(x);
    if (trace) out.layer_outputs.push_back(x);
  }
  out.last_hidden_state = tm.final_layer_norm->forward(x);
  const int64_t B = ids.size(0), D = x.size(2);
  at::Tensor pos = clip_pool_positions(ids, config_.eos_token_id).to(at::kLong).view({B, 1, 1}).expand({B, 1, D});
  out.pooler_output = out.last_hidden_state.gather(1, pos).squeeze(1);
  return out;
}

namespace {

nn::LoadRules clip_load_rules() {
  nn::LoadRules rules;
  // A buffer of older transformers checkpoints, the projection of CLIPTextModelWithProjection and
  // the contrastive temperature that ComfyUI keeps beside it in the clip_l files it saves:
  // CLIPTextModel uses none of them.
  rules.skip_prefixes = {"text_model.embeddings.position_ids", "text_projection.", "logit_scale"};
  return rules;
}

}  // namespace

void check_clip_text_weights(const io::ClipTextConfig& config, const io::TensorStore& store) {
  // Built only for its parameter names and shapes: uninitialised parameters take no memory.
  ClipTextModel model(config);
  nn::check_module(*model, store, clip_load_rules());
}

ClipTextModel load_clip_text_model(const io::ClipTextConfig& config, const io::TensorStore& store,
                                   at::ScalarType dtype, at::Device device, const nn::WeightAdjust& adjust) {
  ClipTextModel model(config);
  nn::LoadRules rules = clip_load_rules();
  rules.adjust = adjust;
  nn::load_module(*model, store, rules, dtype, device);
  return model;
}

ClipTextModel load_clip_text_model(const io::ModelDir& dir, at::ScalarType dtype, at::Device device) {
  return load_clip_text_model(dir.clip_config(), dir.open_weights("text_encoder"), dtype, device);
}

}  // namespace fluxmpi::text_models
