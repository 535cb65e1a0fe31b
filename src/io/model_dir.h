#pragma once
/// A FluxPipeline model directory in the diffusers layout:
///   model_index.json, transformer/, scheduler/, vae/, text_encoder/, text_encoder_2/,
///   tokenizer/, tokenizer_2/.
/// Configs are parsed on first use; check_consistency() cross-checks them.

#include <optional>
#include <string>

#include "io/configs.h"
#include "io/flux2_configs.h"
#include "io/single_file.h"
#include "io/tensor_store.h"

namespace fluxmpi::io {

/// Where a run's model comes from: the command line's --model, the per-component overrides and
/// --model-config (docs/cli.md, "Using the files you already have").
struct ModelSources {
  std::string model;  ///< a diffusers FluxPipeline folder, or one .safetensors file
  /// Replace one component of `model`: a diffusers component folder or a single file each.
  std::string transformer, vae, text_encoder, text_encoder_2;
  /// A diffusers-layout folder whose configs, tokenizers and scheduler describe the weights (its
  /// weights are never read). Empty: `model` when it is a folder, else the shipped FLUX.1-dev or
  /// FLUX.1-schnell folder under `shipped_models`, chosen by the transformer's guidance embedder.
  std::string model_config;
  std::string shipped_models;  ///< the folder holding the shipped FLUX.1-dev/ and FLUX.1-schnell/

  const std::string& override_of(Component c) const;
  bool only_a_folder() const;  ///< `model` alone (the diffusers folder of old)
};

/// Where one component's weights are, once resolved.
struct ComponentSource {
  std::string path;          ///< a folder or a file; empty: no source (the component is not available)
  bool single_file = false;
  ComponentInFile found;     ///< with single_file: the component's prefix and layout inside the file
  std::string missing;       ///< with an empty path: why (names the option to give)
  bool gguf = false;         ///< with single_file: a GGUF file (io/gguf.h)
  std::string quantization;  ///< GGUF: its tensors' types ("F32 x 471, Q8_0 x 304, F16 x 5")

  /// "/m/flux1-dev.safetensors (original FLUX keys under 'model.diffusion_model.')",
  /// "/m/flux1-dev-Q8_0.gguf (GGUF, original FLUX keys; F32 x 471, Q8_0 x 304, F16 x 5)" or "/m/transformer (diffusers folder)"
  std::string describe() const;
};

/// The model family a pipeline folder holds: FLUX.1 (FluxPipeline and its image-input variants) or
/// FLUX.2 (Flux2Pipeline, Flux2KleinPipeline).
enum class ModelFamily { Flux1, Flux2 };

/// FLUX.1-dev is guidance-distilled (a guidance embedding); FLUX.1-schnell is not.
enum class Variant { Dev, Schnell };
const char* variant_name(Variant v);

class ModelDir {
 public:
  /// Checks that `root` is a directory with model_index.json; throws ConfigError otherwise.
  explicit ModelDir(const std::string& root);
  /// Resolves `sources`: the config folder (see ModelSources::model_config) and each component's
  /// weights, detecting the layout of every single file from its header. Throws ConfigError /
  /// WeightError / UsageError naming the option and the file.
  explicit ModelDir(const ModelSources& sources);

  const std::string& root() const { return root_; }
  /// root/relative
  std::string path(const std::string& relative) const;
  /// "model dir '<root>': <relative>" — the prefix of every error about a file of this model.
  std::string label(const std::string& relative) const;
  /// Requires the component directory to exist (ConfigError naming it otherwise).
  std::string component_dir(const std::string& component) const;

  ConfigReader read_config(const std::string& relative) const;
  const TransformerConfig& transformer_config() const;
  const SchedulerConfig& scheduler_config() const;
  const VaeConfig& vae_config() const;
  const ClipTextConfig& clip_config() const;
  const T5Config& t5_config() const;
  Variant variant() const { return transformer_config().guidance_embeds ? Variant::Dev : Variant::Schnell; }
  /// model_index.json's _class_name (of the config folder): "FluxPipeline", "FluxFillPipeline", ...
  const std::string& pipeline_class() const { return pipeline_class_; }
  ModelFamily family() const;
  /// FLUX.2 folders only: dev, klein or klein base (model_index.json's class and is_distilled).
  Flux2Kind flux2_kind() const { return flux2_kind_; }
  /// FLUX.2 folders only: transformer/config.json as Flux2Transformer2DModel.
  const Flux2TransformerConfig& flux2_transformer_config() const;

  /// Configs that must agree: T5 d_model = joint_attention_dim, CLIP hidden_size =
  /// pooled_projection_dim, 4 * VAE latent_channels = in_channels. `with_text` = false skips the
  /// text encoders (a resumed run that does not encode).
  void check_consistency(bool with_text = true) const;
  /// Compares the transformer config with the shapes in the weight headers (block counts, widths);
  /// throws ConfigError naming config.json and the key that disagrees.
  void check_transformer_weights(const TensorStore& store) const;

  TensorStore open_weights(const std::string& component) const;

  /// The sources as resolved (paths made absolute); the folder layout of old when built from a root.
  const ModelSources& sources() const { return sources_; }
  const ComponentSource& source(Component c) const;
  /// Throws UsageError naming the option to give when the component has no source.
  void require(Component c) const;
  /// "transformer: <source>" lines and the config folder, for --dry-run and the log.
  std::string describe_sources() const;

 private:
  std::string root_;
  std::string pipeline_class_ = "FluxPipeline";
  Flux2Kind flux2_kind_ = Flux2Kind::Dev;
  mutable std::optional<Flux2TransformerConfig> flux2_transformer_;
  ModelSources sources_;
  ComponentSource components_[4];
  mutable std::optional<TransformerConfig> transformer_;
  mutable std::optional<SchedulerConfig> scheduler_;
  mutable std::optional<VaeConfig> vae_;
  mutable std::optional<ClipTextConfig> clip_;
  mutable std::optional<T5Config> t5_;
};

}  // namespace fluxmpi::io
