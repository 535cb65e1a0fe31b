#pragma once
/// A FluxPipeline model directory in the diffusers layout:
///   model_index.json, transformer/, scheduler/, vae/, text_encoder/, text_encoder_2/,
///   tokenizer/, tokenizer_2/.
/// Configs are parsed on first use; check_consistency() cross-checks them.

#include <optional>
#include <string>

#include "io/configs.h"
#include "io/tensor_store.h"

namespace fluxmpi::io {

/// FLUX.1-dev is guidance-distilled (a guidance embedding); FLUX.1-schnell is not.
enum class Variant { Dev, Schnell };
const char* variant_name(Variant v);

class ModelDir {
 public:
  /// Checks that `root` is a directory with model_index.json; throws ConfigError otherwise.
  explicit ModelDir(const std::string& root);

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

  /// Configs that must agree: T5 d_model = joint_attention_dim, CLIP hidden_size =
  /// pooled_projection_dim, 4 * VAE latent_channels = in_channels. `with_text` = false skips the
  /// text encoders (a resumed run that does not encode).
  void check_consistency(bool with_text = true) const;
  /// Compares the transformer config with the shapes in the weight headers (block counts, widths);
  /// throws ConfigError naming config.json and the key that disagrees.
  void check_transformer_weights(const TensorStore& store) const;

  TensorStore open_weights(const std::string& component) const;

 private:
  std::string root_;
  mutable std::optional<TransformerConfig> transformer_;
  mutable std::optional<SchedulerConfig> scheduler_;
  mutable std::optional<VaeConfig> vae_;
  mutable std::optional<ClipTextConfig> clip_;
  mutable std::optional<T5Config> t5_;
};

}  // namespace fluxmpi::io
