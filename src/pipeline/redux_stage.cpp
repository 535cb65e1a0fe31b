#include "pipeline/redux_stage.h"

#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "models/common/loader.h"
#include "models/siglip/redux_embedder.h"
#include "models/siglip/siglip_processor.h"
#include "models/siglip/siglip_vision.h"

namespace fluxmpi::pipeline {

void check_redux(const io::ReduxDir& dir, const io::TransformerConfig& transformer, const std::string& transformer_label) {
  const int64_t width = dir.embedder_config().txt_in_features;
  if (width != transformer.joint_attention_dim)
    throw ConfigError(str_cat(dir.label("image_embedder/config.json"), ": 'txt_in_features' is ", width,
                              ", but the transformer reads text tokens of ", transformer.joint_attention_dim,
                              " (joint_attention_dim, ", transformer_label, "): this Redux model is for another FLUX"));
  siglip::check_siglip_vision_weights(dir.encoder_config(), dir.open_weights("image_encoder"));
  siglip::check_redux_embedder_weights(dir.embedder_config(), dir.open_weights("image_embedder"));
}

struct ReduxEncoder::Impl {
  io::SiglipProcessorConfig processor;
  siglip::SiglipVisionModel encoder{nullptr};
  siglip::ReduxImageEncoder embedder{nullptr};
  at::Device device = at::kCPU;
};

ReduxEncoder::ReduxEncoder(const io::ReduxDir& dir, at::ScalarType dtype, at::Device device) : impl_(std::make_unique<Impl>()) {
  impl_->processor = dir.processor_config();
  impl_->device = device;
  impl_->encoder = siglip::load_siglip_vision_model(dir.encoder_config(), dir.open_weights("image_encoder"), dtype, device);
  impl_->embedder = siglip::load_redux_embedder(dir.embedder_config(), dir.open_weights("image_embedder"), dtype, device);
}

ReduxEncoder::~ReduxEncoder() = default;
ReduxEncoder::ReduxEncoder(ReduxEncoder&&) noexcept = default;

at::Tensor ReduxEncoder::encode(const std::vector<io::Image8>& images) const {
  c10::InferenceMode guard;
  FLUX_CHECK(!images.empty(), "Redux needs at least one image");
  std::vector<at::Tensor> out;
  for (const io::Image8& image : images) {
    const at::Tensor pixels = siglip::siglip_preprocess(image, impl_->processor).pixel_values.to(impl_->device);
    out.push_back(impl_->embedder->forward(impl_->encoder->forward(pixels).last_hidden_state));
  }
  return at::cat(out, 0);
}

int64_t ReduxEncoder::parameter_bytes() const {
  return nn::parameter_bytes(*impl_->encoder) + nn::parameter_bytes(*impl_->embedder);
}

siglip::ReduxPrompt redux_text(const at::Tensor& prompt_embeds, const at::Tensor& pooled, int64_t max_sequence_length,
                               const io::TransformerConfig& tc, const at::Tensor& image_embeds,
                               const std::vector<double>& prompt_scales, const std::vector<double>& pooled_scales) {
  c10::InferenceMode guard;
  const auto options = image_embeds.options();
  const at::Tensor text = prompt_embeds.defined() ? prompt_embeds : at::zeros({max_sequence_length, tc.joint_attention_dim}, options);
  const at::Tensor pool = pooled.defined() ? pooled : at::zeros({tc.pooled_projection_dim}, options);
  return siglip::redux_prompt(text, pool, image_embeds, prompt_scales, pooled_scales);
}

}  // namespace fluxmpi::pipeline
