#include "io/flux2_configs.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {

const char* flux2_kind_name(Flux2Kind kind) {
  switch (kind) {
    case Flux2Kind::Dev: return "dev";
    case Flux2Kind::Klein: return "klein";
    case Flux2Kind::KleinBase: return "klein-base";
  }
  return "?";
}

namespace {

void require(const io::ConfigReader& r, const char* key) {
  if (!r.has(key)) r.fail(key, "is missing (Flux2Transformer2DModel configs name every field)");
}

}  // namespace

bool is_flux2_transformer_config(const ConfigReader& r) {
  return r.string("_class_name", "") == "Flux2Transformer2DModel";
}

Flux2TransformerConfig parse_flux2_transformer_config(const ConfigReader& r) {
  const std::string cls = r.string("_class_name", "");
  if (cls != kFlux2TransformerClass)
    r.fail("_class_name", str_cat("must be \"", kFlux2TransformerClass, "\" (a FLUX.2 transformer), got \"", cls, "\""));
  for (const char* key : {"patch_size", "in_channels", "num_layers", "num_single_layers", "attention_head_dim",
                          "num_attention_heads", "joint_attention_dim", "timestep_guidance_channels", "mlp_ratio",
                          "axes_dims_rope", "rope_theta", "eps", "guidance_embeds"})
    require(r, key);
  Flux2TransformerConfig c;
  c.patch_size = r.positive("patch_size", c.patch_size);
  c.in_channels = r.positive("in_channels", c.in_channels);
  c.out_channels = r.positive("out_channels", c.in_channels);
  c.num_layers = r.integer("num_layers", c.num_layers, 0);
  c.num_single_layers = r.integer("num_single_layers", c.num_single_layers, 0);
  c.attention_head_dim = r.positive("attention_head_dim", c.attention_head_dim);
  c.num_attention_heads = r.positive("num_attention_heads", c.num_attention_heads);
  c.joint_attention_dim = r.positive("joint_attention_dim", c.joint_attention_dim);
  c.timestep_guidance_channels = r.positive("timestep_guidance_channels", c.timestep_guidance_channels);
  c.mlp_ratio = r.positive_number("mlp_ratio", c.mlp_ratio);
  c.axes_dims_rope = r.integer_list("axes_dims_rope", c.axes_dims_rope, 0);
  c.rope_theta = r.positive_number("rope_theta", c.rope_theta);
  c.eps = r.positive_number("eps", c.eps);
  c.guidance_embeds = r.boolean("guidance_embeds", c.guidance_embeds);
  c.json_text = r.text();

  // The pipeline packs 2x2 latent patches into the channels itself (Flux2Pipeline._patchify_latents).
  if (c.patch_size != 1) r.fail("patch_size", str_cat("must be 1 (FLUX.2 patchifies the latents itself), got ", c.patch_size));
  if (c.in_channels % 4 != 0)
    r.fail("in_channels", str_cat("must be a multiple of 4 (patchified 2x2 latents), got ", c.in_channels));
  if (c.num_blocks() < 1) r.fail("num_layers", "and 'num_single_layers' are both 0: the transformer has no blocks");
  if (c.timestep_guidance_channels % 2 != 0)
    r.fail("timestep_guidance_channels", str_cat("must be even (cos and sin halves), got ", c.timestep_guidance_channels));
  if (c.mlp_hidden_dim() < 1) r.fail("mlp_ratio", str_cat("gives an empty feed-forward (", c.mlp_ratio, ")"));
  if (c.axes_dims_rope.size() != 4)
    r.fail("axes_dims_rope", str_cat("must have 4 entries (position axes T, H, W, L), got ", c.axes_dims_rope.size()));
  int64_t rope_sum = 0;
  for (int64_t d : c.axes_dims_rope) {
    if (d <= 0 || d % 2 != 0) r.fail("axes_dims_rope", str_cat("entries must be positive and even, got ", d));
    rope_sum += d;
  }
  if (rope_sum != c.attention_head_dim)
    r.fail("axes_dims_rope", str_cat("must sum to attention_head_dim (", c.attention_head_dim, "), got ", rope_sum));
  return c;
}

TransformerConfig transformer_shape(const Flux2TransformerConfig& c) {
  TransformerConfig s;
  s.patch_size = c.patch_size;
  s.in_channels = c.in_channels;
  s.out_channels = c.out_channels;
  s.num_layers = c.num_layers;
  s.num_single_layers = c.num_single_layers;
  s.attention_head_dim = c.attention_head_dim;
  s.num_attention_heads = c.num_attention_heads;
  s.joint_attention_dim = c.joint_attention_dim;
  s.pooled_projection_dim = 0;
  s.guidance_embeds = c.guidance_embeds;
  s.axes_dims_rope = c.axes_dims_rope;
  s.json_text = c.json_text;
  return s;
}

int64_t LlmShape::layer_params() const {
  const int64_t H = hidden_size, q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  // q, k, v, o without biases; gate, up, down; two RMSNorm weights; Qwen3's q/k norms over head_dim.
  return H * q + 2 * H * kv + q * H + 3 * H * intermediate_size + 2 * H + (qk_norm ? 2 * head_dim : 0);
}

int64_t LlmShape::params(int64_t layers, bool final_norm) const {
  return vocab_size * hidden_size + layers * layer_params() + (final_norm ? hidden_size : 0);
}

LlmShape parse_llm_shape(const ConfigReader& top) {
  LlmShape s;
  const std::vector<std::string> arch = top.string_list("architectures", {});
  if (arch.size() != 1)
    top.fail("architectures", "must name one class (Qwen3ForCausalLM or Mistral3ForConditionalGeneration)");
  s.architecture = arch.front();
  std::optional<ConfigReader> nested;
  if (s.architecture == "Mistral3ForConditionalGeneration") {
    if (!top.has("text_config") || !top.json().at("text_config").is_object())
      top.fail("text_config", "is missing: Mistral3ForConditionalGeneration keeps its text tower's config there");
    nested.emplace(ConfigReader::from_text(top.json().at("text_config").dump(), top.label() + ": text_config"));
  } else if (s.architecture != "Qwen3ForCausalLM") {
    top.fail("architectures", str_cat("\"", s.architecture,
                                      "\" is not a FLUX.2 text encoder (Qwen3ForCausalLM or Mistral3ForConditionalGeneration)"));
  }
  const ConfigReader& r = nested ? *nested : top;
  auto need = [&](const char* key) {
    if (!r.has(key)) r.fail(key, "is missing");
    return r.positive(key, 1);
  };
  s.vocab_size = need("vocab_size");
  s.hidden_size = need("hidden_size");
  s.intermediate_size = need("intermediate_size");
  s.num_hidden_layers = need("num_hidden_layers");
  s.num_attention_heads = need("num_attention_heads");
  s.num_key_value_heads = r.positive("num_key_value_heads", s.num_attention_heads);
  s.head_dim = r.positive("head_dim", s.hidden_size / s.num_attention_heads);
  s.qk_norm = s.architecture == "Qwen3ForCausalLM";
  if (s.num_attention_heads % s.num_key_value_heads != 0)
    r.fail("num_key_value_heads", str_cat("must divide num_attention_heads (", s.num_attention_heads, "), got ",
                                          s.num_key_value_heads));
  return s;
}

Flux2Kind parse_flux2_kind(const ConfigReader& index) {
  const std::string cls = index.string("_class_name", "");
  if (cls == "Flux2Pipeline") return Flux2Kind::Dev;
  if (cls == "Flux2KleinPipeline") return index.boolean("is_distilled", false) ? Flux2Kind::Klein : Flux2Kind::KleinBase;
  index.fail("_class_name", str_cat("must be Flux2Pipeline or Flux2KleinPipeline for a FLUX.2 folder, got \"", cls, "\""));
}

std::vector<int64_t> default_text_encoder_layers(Flux2Kind kind) {
  if (kind == Flux2Kind::Dev) return {10, 20, 30};
  return {9, 18, 27};
}

}  // namespace fluxmpi::io
