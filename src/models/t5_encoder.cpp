// Semantics of transformers T5EncoderModel (T5 v1.1: RMS norm, unscaled attention with a
// bucketed relative position bias from block 0, gated-GELU feed-forward, eager attention), written
// against nn::attention_via and the common layers.

#include "models/t5_encoder.h"

#include <c10/core/InferenceMode.h>

#include <cmath>

#include "core/error.h"
#include "models/common/attention.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::text_models {

at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, int64_t num_buckets,
                                       int64_t max_distance) {
  // The float operations below are those of transformers, in the same order and precision, so
  // that positions on a bin edge fall into the same bucket.
  const int64_t half = num_buckets / 2;
  const int64_t max_exact = half / 2;
  at::Tensor buckets = relative_position.gt(0).to(at::kLong) * half;
  at::Tensor distance = relative_position.abs();
  at::Tensor is_small = distance.lt(max_exact);
  // Distances below max_exact take the exact branch; clamping them to 1 only keeps log() finite.
  at::Tensor scaled = at::log(distance.clamp_min(1).to(at::kFloat) / max_exact) /
                      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                      (half - max_exact);
  at::Tensor large = (scaled.to(at::kLong) + max_exact).clamp_max(half - 1);
  return buckets + at::where(is_small, distance, large);
}

T5AttentionImpl::T5AttentionImpl(const io::T5Config& c, bool has_relative_attention_bias)
    : heads(c.num_heads),
      d_kv(c.d_kv),
      num_buckets(c.relative_attention_num_buckets),
      max_distance(c.relative_attention_max_distance) {
  const int64_t inner = c.num_heads * c.d_kv;
  q = register_module("q", nn::Linear(c.d_model, inner, false));
  k = register_module("k", nn::Linear(c.d_model, inner, false));
  v = register_module("v", nn::Linear(c.d_model, inner, false));
  o = register_module("o", nn::Linear(inner, c.d_model, false));
  if (has_relative_attention_bias)
    relative_attention_bias = register_module("relative_attention_bias", nn::Embedding(num_buckets, heads));
}

at::Tensor T5AttentionImpl::compute_bias(int64_t query_length, int64_t key_length) const {
  FLUX_CHECK(!relative_attention_bias.is_empty(), "compute_bias on a T5 attention without the bias table");
  const at::Tensor& table = relative_attention_bias->weight;
  at::TensorOptions opts = at::TensorOptions().dtype(at::kLong).device(table.device());
  at::Tensor relative = at::arange(key_length, opts).unsqueeze(0) - at::arange(query_length, opts).unsqueeze(1);
  at::Tensor values = relative_attention_bias->forward(t5_relative_position_bucket(relative, num_buckets, max_distance));
  // [Lq, Lk, H] -> [1, H, Lq, Lk]
  return values.permute({2, 0, 1}).unsqueeze(0).contiguous();
}

at::Tensor T5AttentionImpl::forward(const at::Tensor& x, const at::Tensor& position_bias) const {
  // x: [B, L, d_model] -> q, k, v: [B, H, L, d_kv]; position_bias: [1, H, L, L]
  const int64_t B = x.size(0), L = x.size(1);
  auto split = [&](const at::Tensor& t) { return t.view({B, L, heads, d_kv}).transpose(1, 2); };
  // T5 folds the 1/sqrt(d) of attention into its initialisation: the scores are not scaled.
  // transformers' T5Attention is eager only (no SDPA implementation): scores = q k^T + position_bias
  // in the run dtype, softmax(scores.float()).type_as(scores), times v. The math path computes
  // that on every libtorch and device (libtorch's reduced-precision softmax accumulates in fp32 and
  // rounds once, as the cast does: tests/unit/attention_paths_test.cpp), so a bf16 or fp16 run
  // rounds where diffusers' FluxPipeline rounds. libtorch >= 2's SDPA would add the bias and take
  // the softmax in fp32 before rounding: on average closer to fp32, but not the reference's
  // arithmetic (docs/architecture.md, "T5 attention").
  at::Tensor out = nn::attention_via(nn::AttentionPath::Math, split(q->forward(x)), split(k->forward(x)),
                                     split(v->forward(x)), position_bias, /*scale=*/1.0);
  return o->forward(out.transpose(1, 2).reshape({B, L, heads * d_kv}));
}

T5LayerSelfAttentionImpl::T5LayerSelfAttentionImpl(const io::T5Config& c, bool has_relative_attention_bias) {
  SelfAttention = register_module("SelfAttention", T5Attention(c, has_relative_attention_bias));
  layer_norm = register_module("layer_norm", nn::RMSNorm(c.d_model, c.layer_norm_epsilon));
}

at::Tensor T5LayerSelfAttentionImpl::forward(const at::Tensor& x, const at::Tensor& position_bias) const {
  return x + SelfAttention->forward(layer_norm->forward(x), position_bias);
}

T5DenseImpl::T5DenseImpl(const io::T5Config& c)
    : act(parse_activation(c.act, "text_encoder_2/config.json 'feed_forward_proj'")), gated(c.gated) {
  if (gated) {
    wi_0 = register_module("wi_0", nn::Linear(c.d_model, c.d_ff, false));
    wi_1 = register_module("wi_1", nn::Linear(c.d_model, c.d_ff, false));
  } else {
    wi = register_module("wi", nn::Linear(c.d_model, c.d_ff, false));
  }
  wo = register_module("wo", nn::Linear(c.d_ff, c.d_model, false));
}

at::Tensor T5DenseImpl::forward(const at::Tensor& x) const {
  // x: [B, L, d_model] -> [B, L, d_ff] -> [B, L, d_model]
  at::Tensor h = gated ? activate(act, wi_0->forward(x)) * wi_1->forward(x) : activate(act, wi->forward(x));
  // wo is kept in fp32 in an fp16 run (see load_t5_encoder).
  if (h.scalar_type() != wo->weight.scalar_type()) h = h.to(wo->weight.scalar_type());
  return wo->forward(h);
}

T5LayerFFImpl::T5LayerFFImpl(const io::T5Config& c) {
  DenseReluDense = register_module("DenseReluDense", T5Dense(c));
  layer_norm = register_module("layer_norm", nn::RMSNorm(c.d_model, c.layer_norm_epsilon));
}

at::Tensor T5LayerFFImpl::forward(const at::Tensor& x) const {
  return x + DenseReluDense->forward(layer_norm->forward(x));
}

T5BlockImpl::T5BlockImpl(const io::T5Config& c, bool has_relative_attention_bias) {
  self_attention = T5LayerSelfAttention(c, has_relative_attention_bias);
  feed_forward = T5LayerFF(c);
  layer_list_ = register_module("layer", torch::nn::ModuleList(self_attention, feed_forward));
}

at::Tensor t5_clamp_fp16(const at::Tensor& x) {
  if (x.scalar_type() != at::kHalf) return x;
  const double max = 65504.0;
  const double limit = x.isinf().any().item<bool>() ? max - 1000.0 : max;
  // Clamped in fp32 (exact both ways) because CPU libtorch 1.13 has no fp16 clamp kernel.
  return x.to(at::kFloat).clamp(-limit, limit).to(at::kHalf);
}

at::Tensor T5BlockImpl::forward(const at::Tensor& x, const at::Tensor& position_bias) const {
  // x: [B, L, d_model]
  at::Tensor h = t5_clamp_fp16(self_attention->forward(x, position_bias));
  return t5_clamp_fp16(feed_forward->forward(h));
}

T5StackImpl::T5StackImpl(const io::T5Config& c) {
  block_list_ = register_module("block", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    blocks.push_back(T5Block(c, /*has_relative_attention_bias=*/i == 0));
    block_list_->push_back(blocks.back());
  }
  final_layer_norm = register_module("final_layer_norm", nn::RMSNorm(c.d_model, c.layer_norm_epsilon));
}

T5EncoderModelImpl::T5EncoderModelImpl(const io::T5Config& c) : config_(c) {
  shared = register_module("shared", nn::Embedding(c.vocab_size, c.d_model));
  encoder = register_module("encoder", T5Stack(c));
}

T5EncoderOutput T5EncoderModelImpl::forward(const at::Tensor& input_ids, bool trace) const {
  // input_ids: [B, L] -> last_hidden_state [B, L, d_model]
  c10::InferenceMode inference;
  nn::check_shape(input_ids, {-1, -1}, "T5 encoder input ids [B, L]");
  FLUX_CHECK(input_ids.size(1) >= 1, "T5 encoder input has no tokens");
  at::Tensor ids = input_ids.to(shared->weight.device(), at::kLong);
  check_token_ids(ids, config_.vocab_size, "T5 encoder (text_encoder_2/config.json)");

  T5EncoderOutput out;
  at::Tensor x = shared->forward(ids);
  const int64_t L = ids.size(1);
  at::Tensor bias = encoder->blocks.front()->self_attention->SelfAttention->compute_bias(L, L);
  if (trace) {
    out.embeddings = x;
    out.position_bias = bias;
  }
  for (const auto& block : encoder->blocks) {
    x = block->forward(x, bias);
    if (trace) out.block_outputs.push_back(x);
  }
  out.last_hidden_state = encoder->final_layer_norm->forward(x);
  return out;
}

namespace {

nn::LoadRules t5_load_rules() {
  nn::LoadRules rules;
  // T5EncoderModel runs neither the decoder nor the LM head of a full T5 checkpoint.
  rules.skip_prefixes = {"decoder.", "lm_head."};
  rules.aliases["shared.weight"] = {"encoder.embed_tokens.weight"};
  return rules;
}

}  // namespace

void check_t5_encoder_weights(const io::T5Config& config, const io::TensorStore& store) {
  // Built only for its parameter names and shapes: uninitialised parameters take no memory.
  T5EncoderModel model(config);
  nn::check_module(*model, store, t5_load_rules());
}

T5EncoderModel load_t5_encoder(const io::T5Config& config, const io::TensorStore& store, at::ScalarType dtype,
                               at::Device device, const nn::WeightAdjust& adjust) {
  T5EncoderModel model(config);
  nn::LoadRules rules = t5_load_rules();
  rules.adjust = adjust;
  nn::load_module(*model, store, rules, dtype, device);
  if (dtype == at::kHalf) {
    // transformers loads T5's `wo` in fp32 for fp16 runs (_keep_in_fp32_modules): its output
    // overflows fp16 in the large checkpoints. Re-read from the file, not widened from fp16.
    at::NoGradGuard no_grad;
    for (auto& item : model->named_parameters(true)) {
      const std::string& key = item.key();
      const std::string suffix = ".DenseReluDense.wo.weight";
      if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0)
        if (adjust.wants(key)) {  // merged again into the fp32 copy
          at::Tensor w = nn::read_tensor(store, key, at::kFloat, at::kCPU).clone();
          adjust.apply(key, w);
          item.value().set_data(w.to(device));
        } else {
          item.value().set_data(nn::read_tensor(store, key, at::kFloat, device));
        }
    }
  }
  return model;
}

T5EncoderModel load_t5_encoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device) {
  return load_t5_encoder(dir.t5_config(), dir.open_weights("text_encoder_2"), dtype, device);
}

}  // namespace fluxmpi::text_models
