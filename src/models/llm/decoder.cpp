// Semantics of transformers Qwen3Model and MistralModel as FLUX.2's pipelines call them
// (output_hidden_states=True, use_cache=False, no position_ids), in our own code.

#include "models/llm/decoder.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>

#include "core/error.h"
#include "models/common/attention.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::llm {
namespace {

// cat(-x2, x1) of the two halves of the last dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x: [B, heads, S, head_dim]; cos, sin: [1, 1, S, head_dim] in x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

// GQA: query head h reads KV head h / groups. [B, kv, S, D] -> [B, kv * groups, S, D].
at::Tensor repeat_kv(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const int64_t B = x.size(0), KV = x.size(1), S = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, KV, groups, S, D}).reshape({B, KV * groups, S, D});
}

bool contains(const std::vector<int64_t>& v, int64_t k) { return std::find(v.begin(), v.end(), k) != v.end(); }

}  // namespace

void check_out_layers(const DecoderConfig& config, const std::vector<int64_t>& out_layers) {
  if (out_layers.empty()) throw ConfigError("text encoder: no hidden-state layers requested");
  for (int64_t k : out_layers)
    if (k < 0 || k > config.num_hidden_layers)
      throw ConfigError(str_cat("text encoder: hidden-state layer ", k, " requested, but the ",
                                architecture_name(config.architecture), " text encoder has ", config.num_hidden_layers,
                                " layers (hidden states 0..", config.num_hidden_layers, ")"));
}

DecoderPart DecoderPart::for_out_layers(const DecoderConfig& config, const std::vector<int64_t>& out_layers) {
  check_out_layers(config, out_layers);
  DecoderPart p;
  p.end_layer = *std::max_element(out_layers.begin(), out_layers.end());
  p.final_norm = contains(out_layers, config.num_hidden_layers);
  return p;
}

DecoderPart DecoderPart::slice(int64_t first, int64_t end) const {
  FLUX_CHECK(first_layer <= first && first <= end && end <= end_layer, "layer slice [", first, ", ", end,
             ") outside [", first_layer, ", ", end_layer, ")");
  return DecoderPart{first, end, final_norm && end == end_layer};
}

std::pair<at::Tensor, at::Tensor> rope_tables(int64_t S, int64_t head_dim, double theta, at::Device device) {
  // As transformers' default rotary embedding: the exponent 2i / head_dim and theta^exponent in
  // fp32, the reciprocal, then each angle one fp32 product position x inv_freq.
  at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor exponent = at::arange(0, head_dim, 2, f32.dtype(at::kLong)).to(at::kFloat) / head_dim;
  at::Tensor inv_freq = at::reciprocal(at::pow(theta, exponent));
  at::Tensor angles = at::outer(at::arange(S, f32), inv_freq);  // [S, head_dim / 2]
  at::Tensor emb = at::cat({angles, angles}, -1);                 // rotate-half layout
  return {emb.cos(), emb.sin()};
}

DecoderAttentionImpl::DecoderAttentionImpl(const DecoderConfig& c)
    : heads(c.num_attention_heads), kv_heads(c.num_key_value_heads), head_dim(c.head_dim) {
  q_proj = register_module("q_proj", nn::Linear(c.hidden_size, heads * head_dim, false));
  k_proj = register_module("k_proj", nn::Linear(c.hidden_size, kv_heads * head_dim, false));
  v_proj = register_module("v_proj", nn::Linear(c.hidden_size, kv_heads * head_dim, false));
  o_proj = register_module("o_proj", nn::Linear(heads * head_dim, c.hidden_size, false));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", nn::RMSNorm(head_dim, c.rms_norm_eps));
    k_norm = register_module("k_norm", nn::RMSNorm(head_dim, c.rms_norm_eps));
  }
}

at::Tensor DecoderAttentionImpl::forward(const at::Tensor& x, const AttentionContext& ctx) const {
  // x: [B, S, H] -> q: [B, heads, S, D], k, v: [B, kv_heads, S, D]
  const int64_t B = x.size(0), S = x.size(1);
  at::Tensor q = q_proj->forward(x).view({B, S, heads, head_dim});
  at::Tensor k = k_proj->forward(x).view({B, S, kv_heads, head_dim});
  at::Tensor v = v_proj->forward(x).view({B, S, kv_heads, head_dim}).transpose(1, 2);
  if (!q_norm.is_empty()) {  // Qwen3: per head, before RoPE
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = apply_rope(q.transpose(1, 2), ctx.cos, ctx.sin);
  k = apply_rope(k.transpose(1, 2), ctx.cos, ctx.sin);
  const int64_t groups = heads / kv_heads;
  // The eager math path on every libtorch, as T5 uses it: softmax(q k^T * scale + bias) v with
  // libtorch's softmax. It gives the same bits on libtorch 1.13 and 2.x and whatever SDPA kernel a
  // build would pick, and it lets the rows without any visible key be defined here rather than by
  // the SDPA version (torch < 2.5 returns NaN there, >= 2.5 zeros, which the reference records):
  // those rows attend to everything (finite) and are then set to zero.
  at::Tensor out = nn::attention_via(nn::AttentionPath::Math, q, repeat_kv(k, groups), repeat_kv(v, groups), ctx.bias,
                                     1.0 / std::sqrt(static_cast<double>(head_dim)), /*causal=*/!ctx.bias.defined());
  if (ctx.empty_rows.defined()) out = out.masked_fill(ctx.empty_rows, 0);
  return o_proj->forward(out.transpose(1, 2).reshape({B, S, heads * head_dim}));
}

DecoderMlpImpl::DecoderMlpImpl(const DecoderConfig& c) {
  gate_proj = register_module("gate_proj", nn::Linear(c.hidden_size, c.intermediate_size, false));
  up_proj = register_module("up_proj", nn::Linear(c.hidden_size, c.intermediate_size, false));
  down_proj = register_module("down_proj", nn::Linear(c.intermediate_size, c.hidden_size, false));
}

at::Tensor DecoderMlpImpl::forward(const at::Tensor& x) const {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

DecoderLayerImpl::DecoderLayerImpl(const DecoderConfig& c) {
  self_attn = register_module("self_attn", DecoderAttention(c));
  mlp = register_module("mlp", DecoderMlp(c));
  input_layernorm = register_module("input_layernorm", nn::RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", nn::RMSNorm(c.hidden_size, c.rms_norm_eps));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const AttentionContext& ctx) const {
  at::Tensor h = x + self_attn->forward(input_layernorm->forward(x), ctx);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

TextDecoderImpl::TextDecoderImpl(const DecoderConfig& config, const DecoderPart& part) : config_(config), part_(part) {
  const int64_t N = config.num_hidden_layers;
  FLUX_CHECK(part.first_layer >= 0 && part.first_layer <= part.end_layer && part.end_layer <= N, "layer range [",
             part.first_layer, ", ", part.end_layer, ") outside 0..", N);
  FLUX_CHECK(!part.final_norm || part.end_layer == N, "the final norm belongs to the part that ends at layer ", N);
  if (part.embeddings()) embed_tokens = register_module("embed_tokens", nn::Embedding(config.vocab_size, config.hidden_size));
  // A plain container named like transformers' ModuleList, holding only this part's layers under
  // their global indices.
  auto list = std::make_shared<torch::nn::Module>();
  for (int64_t g = part.first_layer; g < part.end_layer; ++g)
    layers.push_back(list->register_module(std::to_string(g), DecoderLayer(config)));
  if (!layers.empty()) register_module("layers", list);
  if (part.final_norm) norm = register_module("norm", nn::RMSNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor TextDecoderImpl::embed(const at::Tensor& input_ids) const {
  // input_ids: [B, S] -> [B, S, H]
  FLUX_CHECK(part_.embeddings(), "this text-encoder part holds no embeddings (first layer ", part_.first_layer, ")");
  c10::InferenceMode inference;
  nn::check_shape(input_ids, {-1, -1}, "text encoder input ids [B, S]");
  FLUX_CHECK(input_ids.size(1) >= 1, "text encoder input has no tokens");
  at::Tensor ids = input_ids.to(embed_tokens->weight.device(), at::kLong);
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= config_.vocab_size)
    throw ConfigError(str_cat("text encoder: token id ", lo < 0 ? lo : hi, " outside the vocabulary 0..",
                              config_.vocab_size - 1, " of its config.json: the tokenizer does not match the model"));
  return embed_tokens->forward(ids);
}

AttentionContext TextDecoderImpl::attention_context(const at::Tensor& attention_mask, int64_t B, int64_t S) const {
  if (config_.sliding_window > 0 && S > config_.sliding_window)
    throw ConfigError(str_cat("text encoder: sequence of ", S, " tokens is longer than text_config.sliding_window (",
                              config_.sliding_window, "), which this decoder does not implement"));
  const at::Tensor& like = layers.empty() ? norm->weight : layers.front()->input_layernorm->weight;
  AttentionContext ctx;
  auto [cos, sin] = rope_tables(S, config_.head_dim, config_.rope_theta, like.device());
  ctx.cos = cos.to(like.scalar_type()).view({1, 1, S, config_.head_dim});
  ctx.sin = sin.to(like.scalar_type()).view({1, 1, S, config_.head_dim});
  if (!attention_mask.defined()) return ctx;
  nn::check_shape(attention_mask, {B, S}, "text encoder attention mask [B, S]");
  at::Tensor keep = attention_mask.to(like.device()).ne(0);  // [B, S]
  if (keep.all().item<bool>()) return ctx;                   // no padding: plain causal attention
  at::Tensor causal = at::ones({S, S}, keep.options()).tril();
  at::Tensor visible = causal.unsqueeze(0).logical_and(keep.unsqueeze(1));  // [B, S_q, S_k]
  at::Tensor empty = visible.any(-1, /*keepdim=*/true).logical_not();         // [B, S_q, 1]
  at::Tensor hidden_key = visible.logical_or(empty).logical_not();
  ctx.bias = at::zeros({B, S, S}, like.options())
                 .masked_fill(hidden_key, -std::numeric_limits<float>::infinity())
                 .unsqueeze(1);
  ctx.empty_rows = empty.unsqueeze(1);
  return ctx;
}

PartOutput TextDecoderImpl::run_layers(const at::Tensor& hidden, const at::Tensor& attention_mask,
                                       const std::vector<int64_t>& collect) const {
  // hidden: [B, S, H] = hidden_states[first_layer]
  c10::InferenceMode inference;
  nn::check_shape(hidden, {-1, -1, config_.hidden_size}, "text encoder hidden states [B, S, H]");
  const int64_t N = config_.num_hidden_layers;
  const int64_t B = hidden.size(0), S = hidden.size(1);
  PartOutput out;
  out.hidden = hidden;
  if (part_.first_layer == 0 && contains(collect, 0)) out.collected[0] = hidden;
  if (layers.empty() && !part_.final_norm) return out;
  AttentionContext ctx = attention_context(attention_mask, B, S);
  int64_t k = part_.first_layer;
  for (const auto& layer : layers) {
    out.hidden = layer->forward(out.hidden, ctx);
    ++k;  // out.hidden is now hidden_states[k], un-normed
    if (k < N && contains(collect, k)) out.collected[k] = out.hidden;
  }
  if (k == N && contains(collect, N)) {
    FLUX_CHECK(part_.final_norm, "hidden state ", N, " requested from a part built without the final norm");
    out.collected[N] = norm->forward(out.hidden);
  }
  return out;
}

at::Tensor TextDecoderImpl::encode(const at::Tensor& ids, const at::Tensor& attention_mask,
                                   const std::vector<int64_t>& out_layers) const {
  const DecoderPart need = DecoderPart::for_out_layers(config_, out_layers);
  FLUX_CHECK(part_.first_layer == 0 && part_.end_layer >= need.end_layer && (part_.final_norm || !need.final_norm),
             "this text-encoder part (layers [", part_.first_layer, ", ", part_.end_layer,
             ")) cannot produce the requested hidden states alone");
  c10::InferenceMode inference;
  return stack_hidden_states(run_layers(embed(ids), attention_mask, out_layers).collected, out_layers);
}

bool TextDecoderImpl::owns_key(const std::string& key) const {
  static const std::regex layer_re(R"(^layers\.(\d+)\.)");
  // Older checkpoints store the RoPE inverse frequencies as buffers; they are recomputed here.
  if (key.find("rotary_emb.") != std::string::npos) return false;
  std::smatch m;
  if (std::regex_search(key, m, layer_re)) {
    const int64_t g = std::stoll(m[1].str());
    return g >= part_.first_layer && g < part_.end_layer;
  }
  if (key.rfind("embed_tokens.", 0) == 0) return part_.embeddings();
  if (key.rfind("norm.", 0) == 0) return part_.final_norm;
  // Any other key of the text tower is the first part's to account for.
  return part_.embeddings();
}

at::Tensor stack_hidden_states(const HiddenStates& states, const std::vector<int64_t>& out_layers) {
  std::vector<at::Tensor> slots;
  for (int64_t k : out_layers) {
    auto it = states.find(k);
    FLUX_CHECK(it != states.end(), "hidden state ", k, " was not collected");
    slots.push_back(it->second);
  }
  // stack(dim=1).permute(0, 2, 1, 3).reshape(B, S, n * H) moves the same values as a concatenation
  // along the features: slot-major blocks of H.
  return at::cat(slots, -1);
}

}  // namespace fluxmpi::llm
