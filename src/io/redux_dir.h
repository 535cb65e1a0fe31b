#pragma once
/// A FLUX.1 Redux folder in the diffusers layout (FluxPriorReduxPipeline, e.g. FLUX.1-Redux-dev):
///   model_index.json, image_encoder/ (transformers SiglipVisionModel: config.json, model.safetensors),
///   feature_extractor/ (SiglipImageProcessor: preprocessor_config.json),
///   image_embedder/ (diffusers ReduxImageEncoder: config.json, diffusion_pytorch_model.safetensors).
/// The configs are parsed and cross-checked when the folder is opened; the weights are read by the
/// models (models/siglip). Defaults are those of transformers / diffusers for absent keys.

#include <cstdint>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "io/tensor_store.h"

namespace fluxmpi::io {

/// transformers SiglipVisionConfig (image_encoder/config.json). A full SiglipConfig (model_type
/// "siglip") is read through its `vision_config`, as SiglipVisionConfig.from_pretrained does.
struct SiglipVisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_channels = 3;
  int64_t image_size = 224;
  int64_t patch_size = 16;
  std::string hidden_act = "gelu_pytorch_tanh";
  double layer_norm_eps = 1e-6;

  /// Patches of the position table: (image_size // patch_size)^2.
  int64_t num_positions() const { return (image_size / patch_size) * (image_size / patch_size); }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// Parameters fluxmpi loads: everything but the attention-pooling head.
  int64_t parameters() const;
};
SiglipVisionConfig parse_siglip_vision_config(const ConfigReader& reader);

/// Pillow resampling filters by their number (PIL.Image.Resampling), as preprocessor configs name them.
enum class Resample { Lanczos = 1, Bicubic = 3 };

/// transformers SiglipImageProcessor (feature_extractor/preprocessor_config.json), as
/// FluxPriorReduxPipeline calls it: preprocess(do_resize=True, do_convert_rgb=True).
struct SiglipProcessorConfig {
  int64_t height = 224;  ///< size["height"]
  int64_t width = 224;   ///< size["width"]
  Resample resample = Resample::Bicubic;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::vector<double> image_mean = {0.5, 0.5, 0.5};
  std::vector<double> image_std = {0.5, 0.5, 0.5};
};
SiglipProcessorConfig parse_siglip_processor_config(const ConfigReader& reader);

/// diffusers ReduxImageEncoder (image_embedder/config.json): redux_up Linear(redux_dim,
/// 3 * txt_in_features), SiLU, redux_down Linear(3 * txt_in_features, txt_in_features).
struct ReduxEmbedderConfig {
  int64_t redux_dim = 1152;
  int64_t txt_in_features = 4096;
  int64_t parameters() const;
};
ReduxEmbedderConfig parse_redux_embedder_config(const ConfigReader& reader);

inline constexpr const char* kReduxPipelineClass = "FluxPriorReduxPipeline";

class ReduxDir {
 public:
  /// Opens `root`: model_index.json must name FluxPriorReduxPipeline; the three configs are parsed
  /// and must agree (the embedder's redux_dim is the encoder's hidden_size; the processor's size
  /// gives the encoder's number of patches). Throws ConfigError naming the file and the key.
  explicit ReduxDir(const std::string& root);

  const std::string& root() const { return root_; }
  /// "redux dir '<root>': <relative>" — the prefix of every error about a file of this folder.
  std::string label(const std::string& relative) const;
  const SiglipVisionConfig& encoder_config() const { return encoder_; }
  const SiglipProcessorConfig& processor_config() const { return processor_; }
  const ReduxEmbedderConfig& embedder_config() const { return embedder_; }
  /// Image tokens one image adds to the text stream: the encoder's patches.
  int64_t image_tokens() const;
  /// The weights of "image_encoder" or "image_embedder" (WeightError / ConfigError naming the folder).
  TensorStore open_weights(const std::string& component) const;

 private:
  std::string root_;
  SiglipVisionConfig encoder_;
  SiglipProcessorConfig processor_;
  ReduxEmbedderConfig embedder_;
};

}  // namespace fluxmpi::io
