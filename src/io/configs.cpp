#include "io/configs.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {

TransformerConfig parse_transformer_config(const ConfigReader& r) {
  TransformerConfig c;
  c.patch_size = r.positive("patch_size", c.patch_size);
  c.in_channels = r.positive("in_channels", c.in_channels);
  c.out_channels = r.positive("out_channels", c.in_channels);
  c.num_layers = r.integer("num_layers", c.num_layers, 0);
  c.num_single_layers = r.integer("num_single_layers", c.num_single_layers, 0);
  c.attention_head_dim = r.positive("attention_head_dim", c.attention_head_dim);
  c.num_attention_heads = r.positive("num_attention_heads", c.num_attention_heads);
  c.joint_attention_dim = r.positive("joint_attention_dim", c.joint_attention_dim);
  c.pooled_projection_dim = r.positive("pooled_projection_dim", c.pooled_projection_dim);
  c.guidance_embeds = r.boolean("guidance_embeds", c.guidance_embeds);
  c.axes_dims_rope = r.integer_list("axes_dims_rope", c.axes_dims_rope, 0);
  c.json_text = r.text();

  if (c.patch_size != 1) r.fail("patch_size", str_cat("must be 1 (FLUX packs 2x2 latent patches itself), got ", c.patch_size));
  if (c.in_channels % 4 != 0)
    r.fail("in_channels", str_cat("must be a multiple of 4 (packed 2x2 latent patches), got ", c.in_channels));
  // FluxPipeline: in = out; FluxControlPipeline: the control latents follow the latents (in = 2 out);
  // FluxFillPipeline: masked-image latents and the 8x8-packed mask follow them (in = 6 out).
  if (c.out_channels % 4 != 0 ||
      (c.in_channels != c.out_channels && c.in_channels != 2 * c.out_channels && c.in_channels != 6 * c.out_channels))
    r.fail("out_channels", str_cat("must be a multiple of 4 with in_channels (", c.in_channels,
                                   ") equal to it (FluxPipeline), twice it (Control) or six times it (Fill), got ",
                                   c.out_channels));
  if (c.num_blocks() < 1) r.fail("num_layers", "and 'num_single_layers' are both 0: the transformer has no blocks");
  int64_t rope_sum = 0;
  for (int64_t d : c.axes_dims_rope) {
    if (d <= 0 || d % 2 != 0) r.fail("axes_dims_rope", str_cat("entries must be positive and even, got ", d));
    rope_sum += d;
  }
  if (c.axes_dims_rope.size() != 3)
    r.fail("axes_dims_rope", str_cat("must have 3 entries (one per position id axis), got ", c.axes_dims_rope.size()));
  if (rope_sum != c.attention_head_dim)
    r.fail("axes_dims_rope", str_cat("must sum to attention_head_dim (", c.attention_head_dim, "), got ", rope_sum));
  return c;
}

std::string to_json(const TransformerConfig& c) {
  nlohmann::ordered_json j = {{"_class_name", "FluxTransformer2DModel"},
                              {"attention_head_dim", c.attention_head_dim},
                              {"axes_dims_rope", c.axes_dims_rope},
                              {"guidance_embeds", c.guidance_embeds},
                              {"in_channels", c.in_channels},
                              {"joint_attention_dim", c.joint_attention_dim},
                              {"num_attention_heads", c.num_attention_heads},
                              {"num_layers", c.num_layers},
                              {"num_single_layers", c.num_single_layers},
                              {"out_channels", c.out_channels == c.in_channels ? nlohmann::ordered_json() : nlohmann::ordered_json(c.out_channels)},
                              {"patch_size", c.patch_size},
                              {"pooled_projection_dim", c.pooled_projection_dim}};
  return j.dump(2) + "\n";
}

SchedulerConfig parse_scheduler_config(const ConfigReader& r) {
  SchedulerConfig c;
  c.num_train_timesteps = r.positive("num_train_timesteps", c.num_train_timesteps);
  c.shift = r.positive_number("shift", c.shift);
  c.use_dynamic_shifting = r.boolean("use_dynamic_shifting", c.use_dynamic_shifting);
  c.base_shift = r.number("base_shift", c.base_shift);
  c.max_shift = r.number("max_shift", c.max_shift);
  c.base_image_seq_len = r.positive("base_image_seq_len", c.base_image_seq_len);
  c.max_image_seq_len = r.positive("max_image_seq_len", c.max_image_seq_len);
  c.shift_terminal = r.optional_number("shift_terminal");
  c.time_shift_type = r.string("time_shift_type", c.time_shift_type);
  if (c.use_dynamic_shifting && c.max_image_seq_len == c.base_image_seq_len)
    r.fail("max_image_seq_len", "must differ from base_image_seq_len when use_dynamic_shifting is true");
  if (c.time_shift_type != "exponential" && c.time_shift_type != "linear")
    r.fail("time_shift_type", str_cat("must be \"exponential\" or \"linear\", got \"", c.time_shift_type, "\""));
  if (c.shift_terminal && !(*c.shift_terminal > 0 && *c.shift_terminal < 1))
    r.fail("shift_terminal", str_cat("must be in (0, 1), got ", *c.shift_terminal));
  // Options FluxPipeline never uses; refusing them beats silently computing another schedule.
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas",
                          "stochastic_sampling"}) {
    if (r.boolean(key, false)) r.fail(key, "= true is not supported by fluxmpi");
  }
  return c;
}

std::string to_json(const SchedulerConfig& c) {
  nlohmann::ordered_json j = {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                              {"base_image_seq_len", c.base_image_seq_len},
                              {"base_shift", c.base_shift},
                              {"max_image_seq_len", c.max_image_seq_len},
                              {"max_shift", c.max_shift},
                              {"num_train_timesteps", c.num_train_timesteps},
                              {"shift", c.shift},
                              {"use_dynamic_shifting", c.use_dynamic_shifting}};
  return j.dump(2) + "\n";
}

VaeConfig parse_vae_config(const ConfigReader& r) {
  VaeConfig c;
  c.in_channels = r.positive("in_channels", c.in_channels);
  c.out_channels = r.positive("out_channels", c.out_channels);
  c.block_out_channels = r.integer_list("block_out_channels", c.block_out_channels, 1);
  c.layers_per_block = r.positive("layers_per_block", c.layers_per_block);
  c.latent_channels = r.positive("latent_channels", c.latent_channels);
  c.norm_num_groups = r.positive("norm_num_groups", c.norm_num_groups);
  c.scaling_factor = r.positive_number("scaling_factor", c.scaling_factor);
  c.shift_factor = r.number("shift_factor", 0.0);
  c.use_post_quant_conv = r.boolean("use_post_quant_conv", c.use_post_quant_conv);
  c.mid_block_add_attention = r.boolean("mid_block_add_attention", c.mid_block_add_attention);
  // diffusers accepts an int or a list (height, width) and tiles with the first entry.
  if (r.has("sample_size") && r.json().at("sample_size").is_array()) {
    const std::vector<int64_t> sizes = r.integer_list("sample_size", {}, 1);
    if (sizes.empty()) r.fail("sample_size", "must not be an empty list");
    c.sample_size = sizes.front();
  } else {
    c.sample_size = r.positive("sample_size", c.sample_size);
  }
  if (c.block_out_channels.empty()) r.fail("block_out_channels", "must not be empty");
  if (c.block_out_channels.size() > 8) r.fail("block_out_channels", "has more than 8 levels");
  for (int64_t ch : c.block_out_channels)
    if (ch % c.norm_num_groups != 0)
      r.fail("block_out_channels", str_cat("entries must be multiples of norm_num_groups (", c.norm_num_groups, "), got ", ch));
  std::string act = r.string("act_fn", "silu");
  if (act != "silu") r.fail("act_fn", str_cat("must be \"silu\", got \"", act, "\""));
  auto up = r.string_list("up_block_types", std::vector<std::string>(c.block_out_channels.size(), "UpDecoderBlock2D"));
  if (up.size() != c.block_out_channels.size())
    r.fail("up_block_types", str_cat("has ", up.size(), " entries but block_out_channels has ", c.block_out_channels.size()));
  for (const auto& t : up)
    if (t != "UpDecoderBlock2D") r.fail("up_block_types", str_cat("entries must be \"UpDecoderBlock2D\", got \"", t, "\""));
  if (r.has("latents_mean") || r.has("latents_std"))
    r.fail("latents_mean", "is set: latent normalisation by mean/std is not used by FLUX and not supported");
  return c;
}

std::string to_json(const VaeConfig& c) {
  const std::vector<std::string> up(c.block_out_channels.size(), "UpDecoderBlock2D");
  const std::vector<std::string> down(c.block_out_channels.size(), "DownEncoderBlock2D");
  nlohmann::ordered_json j = {{"_class_name", "AutoencoderKL"},
                              {"act_fn", "silu"},
                              {"block_out_channels", c.block_out_channels},
                              {"down_block_types", down},
                              {"in_channels", c.in_channels},
                              {"latent_channels", c.latent_channels},
                              {"latents_mean", nullptr},
                              {"latents_std", nullptr},
                              {"layers_per_block", c.layers_per_block},
                              {"mid_block_add_attention", c.mid_block_add_attention},
                              {"norm_num_groups", c.norm_num_groups},
                              {"out_channels", c.out_channels},
                              {"sample_size", c.sample_size},
                              {"scaling_factor", c.scaling_factor},
                              {"shift_factor", c.shift_factor},
                              {"up_block_types", up},
                              {"use_post_quant_conv", c.use_post_quant_conv},
                              {"use_quant_conv", false}};
  return j.dump(2) + "\n";
}

ClipTextConfig parse_clip_text_config(const ConfigReader& r) {
  ClipTextConfig c;
  c.vocab_size = r.positive("vocab_size", c.vocab_size);
  c.hidden_size = r.positive("hidden_size", c.hidden_size);
  c.intermediate_size = r.positive("intermediate_size", c.intermediate_size);
  c.num_hidden_layers = r.positive("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = r.positive("num_attention_heads", c.num_attention_heads);
  c.max_position_embeddings = r.positive("max_position_embeddings", c.max_position_embeddings);
  c.hidden_act = r.string("hidden_act", c.hidden_act);
  c.layer_norm_eps = r.positive_number("layer_norm_eps", c.layer_norm_eps);
  c.eos_token_id = r.integer("eos_token_id", c.eos_token_id, 0);
  if (c.hidden_act != "quick_gelu" && c.hidden_act != "gelu" && c.hidden_act != "gelu_new")
    r.fail("hidden_act", str_cat("must be quick_gelu, gelu or gelu_new, got \"", c.hidden_act, "\""));
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("hidden_size", str_cat("(", c.hidden_size, ") must be a multiple of num_attention_heads (", c.num_attention_heads, ")"));
  return c;
}

std::string to_json(const ClipTextConfig& c) {
  nlohmann::ordered_json j = {{"architectures", {"CLIPTextModel"}},
                              {"eos_token_id", c.eos_token_id},
                              {"hidden_act", c.hidden_act},
                              {"hidden_size", c.hidden_size},
                              {"intermediate_size", c.intermediate_size},
                              {"layer_norm_eps", c.layer_norm_eps},
                              {"max_position_embeddings", c.max_position_embeddings},
                              {"model_type", "clip_text_model"},
                              {"num_attention_heads", c.num_attention_heads},
                              {"num_hidden_layers", c.num_hidden_layers},
                              {"vocab_size", c.vocab_size}};
  return j.dump(2) + "\n";
}

T5Config parse_t5_config(const ConfigReader& r) {
  T5Config c;
  c.vocab_size = r.positive("vocab_size", c.vocab_size);
  c.d_model = r.positive("d_model", c.d_model);
  c.d_kv = r.positive("d_kv", c.d_kv);
  c.d_ff = r.positive("d_ff", c.d_ff);
  c.num_layers = r.positive("num_layers", c.num_layers);
  c.num_heads = r.positive("num_heads", c.num_heads);
  c.relative_attention_num_buckets = r.integer("relative_attention_num_buckets", c.relative_attention_num_buckets, 2);
  c.relative_attention_max_distance = r.integer("relative_attention_max_distance", c.relative_attention_max_distance, 2);
  c.layer_norm_epsilon = r.positive_number("layer_norm_epsilon", c.layer_norm_epsilon);
  std::string ff = r.string("feed_forward_proj", "relu");
  std::string act = ff;
  if (ff.rfind("gated-", 0) == 0) {
    c.gated = true;
    act = ff.substr(6);
  }
  // transformers maps "gated-gelu" to gelu_new (the tanh approximation).
  if (act == "gelu" && c.gated) act = "gelu_new";
  if (act != "relu" && act != "gelu" && act != "gelu_new" && act != "silu")
    r.fail("feed_forward_proj", str_cat("must be relu, gelu, silu or gated-<one of them>, got \"", ff, "\""));
  c.act = act;
  if (c.relative_attention_num_buckets % 2 != 0)
    r.fail("relative_attention_num_buckets", str_cat("must be even, got ", c.relative_attention_num_buckets));
  return c;
}

std::string to_json(const T5Config& c) {
  const std::string act = c.act == "gelu_new" && c.gated ? "gelu" : c.act;
  nlohmann::ordered_json j = {{"architectures", {"T5EncoderModel"}},
                              {"d_ff", c.d_ff},
                              {"d_kv", c.d_kv},
                              {"d_model", c.d_model},
                              {"feed_forward_proj", (c.gated ? "gated-" : "") + act},
                              {"layer_norm_epsilon", c.layer_norm_epsilon},
                              {"model_type", "t5"},
                              {"num_heads", c.num_heads},
                              {"num_layers", c.num_layers},
                              {"relative_attention_max_distance", c.relative_attention_max_distance},
                              {"relative_attention_num_buckets", c.relative_attention_num_buckets},
                              {"vocab_size", c.vocab_size}};
  return j.dump(2) + "\n";
}

}  // namespace fluxmpi::io
