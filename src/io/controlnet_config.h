#pragma once
/// FluxControlNetModel's config.json (diffusers), checked on its own and against the transformer it
/// serves, and how the merged residuals of one or several ControlNets feed the transformer's blocks
/// (FluxTransformer2DModel.forward's interval_control / controlnet_blocks_repeat). Torch-free: the
/// planner and the option checks use it without a model.
///
/// Layouts: the InstantX layout (no conditioning_embedding_channels) takes the control image's VAE
/// latents, packed like the latents; a Union model (num_mode set) also prepends a learned token for
/// the control mode to the text tokens; the XLabs layout (conditioning_embedding_channels set) runs
/// the control image's pixels through input_hint_block and its residuals repeat over the blocks.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/configs.h"
#include "io/json_config.h"

namespace fluxmpi::io {

/// FluxControlNetModel arguments.
struct ControlNetConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t num_layers = 19;
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  std::optional<int64_t> num_mode;                         ///< Union: the number of control modes
  std::optional<int64_t> conditioning_embedding_channels;  ///< XLabs: input_hint_block's output channels
  std::string json_text;                                   ///< config.json as read

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t num_blocks() const { return num_layers + num_single_layers; }
  bool is_union() const { return num_mode.has_value(); }
  /// The control image goes in as pixels (input_hint_block), not as VAE latents.
  bool takes_pixels() const { return conditioning_embedding_channels.has_value(); }
  /// Text tokens the ControlNet's blocks see per prompt token count S: S + 1 with the mode token.
  int64_t text_tokens(int64_t prompt_tokens) const { return prompt_tokens + (is_union() ? 1 : 0); }
};

/// input_hint_block = ControlNetConditioningEmbedding(block_out_channels=(16, 16, 16, 16)): 3 strided
/// convolutions, so pixels per hint cell.
inline constexpr int64_t kHintDownsample = 8;
inline constexpr int64_t kHintChannels = 16;

/// Parses config.json; ConfigError naming the file and key for bad values, and for a config of
/// another model (a `_class_name` other than FluxControlNetModel).
ControlNetConfig parse_controlnet_config(const ConfigReader& reader);
/// config.json text as diffusers writes it.
std::string to_json(const ControlNetConfig& config);

/// ConfigError (naming `label`, the key, both values) unless the ControlNet can feed `transformer`:
/// the same stream width (its residuals are added to the transformer's hidden states), text and
/// pooled widths (it reads the same prompt embeddings), latent features (it reads the packed
/// latents), and no more residual samples than the transformer has blocks of each kind (except the
/// XLabs layout, whose samples repeat); `vae_scale_factor` (pixels per latent cell) checks that
/// input_hint_block's tokens are the latent tokens.
void check_controlnet_fits(const ControlNetConfig& controlnet, const TransformerConfig& transformer,
                           int64_t vae_scale_factor, const std::string& label);

/// How merged residual samples feed the transformer's blocks.
struct ResidualLayout {
  int64_t double_samples = 0;  ///< controlnet_block_samples (0: none)
  int64_t single_samples = 0;  ///< controlnet_single_block_samples (0: none)
  bool repeat = false;         ///< controlnet_blocks_repeat: double block i adds sample i % n

  int64_t samples() const { return double_samples + single_samples; }
  /// The sample global block `block` adds (double samples first, then single ones), or -1:
  /// double block i adds sample i // ceil(num_layers / n) (i % n when repeating), single block j
  /// sample n_double + j // ceil(num_single_layers / n_single).
  int64_t sample_of_block(int64_t block, const TransformerConfig& transformer) const;
  /// The distinct samples that blocks [first, last] add, ascending.
  std::vector<int64_t> samples_of_blocks(int64_t first, int64_t last, const TransformerConfig& transformer) const;
};

/// The layout of the samples a list of ControlNet runs merges (FluxMultiControlNetModel: the first
/// run's samples, then each later run's added where both have some, zip() keeping the shorter
/// list). `runs` holds the config of the net behind each run (a Union net run once per condition
/// appears once per condition).
ResidualLayout merged_layout(const std::vector<const ControlNetConfig*>& runs);

}  // namespace fluxmpi::io
