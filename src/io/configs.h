#pragma once
/// Typed configs of the FLUX pipeline components, parsed from their config.json with the defaults
/// of diffusers / transformers for absent keys. Parsing checks types and values; consistency
/// between components is checked by ModelDir.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace fluxmpi::io {

/// FluxTransformer2DModel (diffusers) arguments.
struct TransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;  ///< null/absent in config.json -> in_channels
  int64_t num_layers = 19;
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  std::string json_text;  ///< the config.json as read (stored in checkpoints)

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t num_blocks() const { return num_layers + num_single_layers; }
  int64_t latent_channels() const { return out_channels / 4; }  ///< the latents' own channels (Fill/Control inputs carry more)
};
TransformerConfig parse_transformer_config(const ConfigReader& reader);
/// config.json text as diffusers writes it (make-tiny-model).
std::string to_json(const TransformerConfig& config);

/// FlowMatchEulerDiscreteScheduler arguments (the options FLUX uses; the others must keep their
/// defaults, which is checked).
struct SchedulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  std::optional<double> shift_terminal;
  std::string time_shift_type = "exponential";  ///< "exponential" | "linear"
};
SchedulerConfig parse_scheduler_config(const ConfigReader& reader);
std::string to_json(const SchedulerConfig& config);

/// AutoencoderKL arguments (decoder side).
struct VaeConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels = {64};
  int64_t layers_per_block = 1;
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  double scaling_factor = 0.18215;
  double shift_factor = 0.0;  ///< null -> 0
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  /// Pixels of a side the VAE was trained on (a list in the config: its first entry). diffusers'
  /// tiled decoding uses it as the tile size in pixels (AutoencoderKL.tile_sample_min_size).
  int64_t sample_size = 32;

  /// 2^(levels - 1): pixels per latent cell.
  int64_t scale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }
};
VaeConfig parse_vae_config(const ConfigReader& reader);
std::string to_json(const VaeConfig& config);

/// transformers CLIPTextConfig.
struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  std::string hidden_act = "quick_gelu";  ///< "quick_gelu" | "gelu" | "gelu_new"
  double layer_norm_eps = 1e-5;
  int64_t eos_token_id = 49407;  ///< 2 = legacy: pool at argmax(ids)
};
ClipTextConfig parse_clip_text_config(const ConfigReader& reader);
std::string to_json(const ClipTextConfig& config);

/// transformers T5Config (encoder side).
struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  bool gated = false;            ///< from feed_forward_proj "gated-<act>"
  std::string act = "relu";      ///< "relu" | "gelu_new" | "gelu" | "silu"
};
T5Config parse_t5_config(const ConfigReader& reader);
std::string to_json(const T5Config& config);

}  // namespace fluxmpi::io
