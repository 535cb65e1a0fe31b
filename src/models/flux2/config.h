#pragma once
/// Flux2Transformer2DModel (diffusers) arguments, parsed from transformer/config.json. Unlike
/// FLUX.1's config (io/configs.h), every architecture field must be present: diffusers'
/// defaults are those of the 32B FLUX.2 [dev], so a missing field would silently describe
/// another model. Only out_channels may be null or absent (-> in_channels).

#include <cstdint>
#include <string>
#include <vector>

#include "io/json_config.h"

namespace fluxmpi::flux2 {

struct TransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  int64_t out_channels = 128;  ///< null/absent in config.json -> in_channels
  int64_t num_layers = 8;
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope = {32, 32, 32, 32};
  double rope_theta = 2000.0;
  double eps = 1e-6;
  bool guidance_embeds = true;  ///< FLUX.2 [dev]: a guidance embedder; [klein]: none
  std::string json_text;        ///< the config.json as read

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }  ///< D
  int64_t num_blocks() const { return num_layers + num_single_layers; }
  /// int(D * mlp_ratio), as Python's int() truncates: the SwiGLU's inner width.
  int64_t mlp_hidden_dim() const { return static_cast<int64_t>(static_cast<double>(inner_dim()) * mlp_ratio); }
  /// Width of the global modulation vectors: double img (6D) | double txt (6D) | single (3D).
  int64_t modulation_dim() const { return 15 * inner_dim(); }
};

inline constexpr const char* kTransformerClass = "Flux2Transformer2DModel";

/// Parses and checks the config (ConfigError "<label>: '<key>' <problem>", one line).
TransformerConfig parse_transformer_config(const io::ConfigReader& reader);
/// Reads `<transformer_dir>/config.json`; errors are labelled "transformer folder '<dir>': config.json".
TransformerConfig read_transformer_config(const std::string& transformer_dir);

}  // namespace fluxmpi::flux2
