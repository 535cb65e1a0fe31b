#pragma once
/// The FLUX.2 family's configs as the torch-free layers need them (the planner, the checkpoint,
/// --dry-run): the transformer (Flux2Transformer2DModel), the decoder-only text encoder's shape
/// (Qwen3ForCausalLM, or the text tower of Mistral3ForConditionalGeneration) and the pipeline
/// (Flux2Pipeline, Flux2KleinPipeline with is_distilled). Defaults are diffusers'/transformers'
/// for absent keys; ../shared/assets/configs/FLUX2-SOURCES.md gives the real models' values.

#include <cstdint>
#include <string>
#include <vector>

#include "io/configs.h"
#include "io/json_config.h"

namespace fluxmpi::io {

/// Which FLUX.2 pipeline a folder holds: [dev] (guidance-distilled, Mistral text encoder), [klein]
/// (step-distilled, Qwen3; guidance ignored) or [klein] base (true CFG with the empty prompt).
enum class Flux2Kind { Dev, Klein, KleinBase };
const char* flux2_kind_name(Flux2Kind kind);  ///< "dev", "klein", "klein-base"

/// Flux2Transformer2DModel (diffusers) arguments: the one config struct of the FLUX.2 transformer
/// (models/flux2 builds its modules from it). Unlike FLUX.1's, every architecture field must be
/// present in config.json: diffusers' defaults are those of the 32B FLUX.2 [dev], so a missing
/// field would silently describe another model. Only out_channels may be null or absent (->
/// in_channels).
struct Flux2TransformerConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  int64_t out_channels = 128;
  int64_t num_layers = 8;
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope = {32, 32, 32, 32};
  double rope_theta = 2000;
  double eps = 1e-6;
  bool guidance_embeds = true;  ///< FLUX.2 [dev]: a guidance embedder; [klein]: none
  std::string json_text;        ///< the config.json as read

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }  ///< D
  int64_t num_blocks() const { return num_layers + num_single_layers; }
  /// int(D * mlp_ratio), as Python's int() truncates: the SwiGLU's inner width.
  int64_t mlp_hidden_dim() const { return static_cast<int64_t>(static_cast<double>(inner_dim()) * mlp_ratio); }
  /// Width of the global modulation vectors: double img (6D) | double txt (6D) | single (3D).
  int64_t modulation_dim() const { return 15 * inner_dim(); }
  int64_t latent_channels() const { return out_channels / 4; }
};
inline constexpr const char* kFlux2TransformerClass = "Flux2Transformer2DModel";
/// Parses and checks the config (ConfigError "<label>: '<key>' <problem>", one line).
Flux2TransformerConfig parse_flux2_transformer_config(const ConfigReader& reader);
/// Whether a transformer config.json is a FLUX.2 one (its _class_name).
bool is_flux2_transformer_config(const ConfigReader& reader);
/// The fields the FLUX.1 and FLUX.2 transformers share (blocks, widths, channels, text width; no
/// pooled projection): what the stage planner and the checkpoint's shapes are computed from.
TransformerConfig transformer_shape(const Flux2TransformerConfig& config);

/// The shape of a decoder-only text encoder: enough to count its parameters and size its working
/// set. Mistral3ForConditionalGeneration's fields are those of its `text_config`.
struct LlmShape {
  std::string architecture;         ///< "Qwen3ForCausalLM" | "Mistral3ForConditionalGeneration"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;             ///< may differ from hidden_size / num_attention_heads
  bool qk_norm = false;             ///< Qwen3: RMSNorm on q and k per head

  /// Parameters of the embeddings and of `layers` decoder layers (+ the final norm when
  /// `final_norm`): what fluxmpi loads to read hidden states up to layer `layers`.
  int64_t params(int64_t layers, bool final_norm) const;
  int64_t layer_params() const;
};
LlmShape parse_llm_shape(const ConfigReader& reader);

/// model_index.json of a FLUX.2 folder: its kind. Throws ConfigError naming the file for a class
/// that is not Flux2Pipeline / Flux2KleinPipeline.
Flux2Kind parse_flux2_kind(const ConfigReader& model_index);
/// diffusers' default text_encoder_out_layers: dev (10, 20, 30), klein (9, 18, 27).
std::vector<int64_t> default_text_encoder_layers(Flux2Kind kind);

}  // namespace fluxmpi::io
