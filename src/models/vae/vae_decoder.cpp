// Semantics of diffusers AutoencoderKL._decode: post_quant_conv when the config enables it, then the
// Decoder; decode() adds tiling and slicing (tiling.h).
#include "models/vae/vae_decoder.h"

#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "core/log.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "models/common/block_reuse.h"

namespace fluxmpi::vae {

VaeDecoderImpl::VaeDecoderImpl(const io::VaeConfig& config) : config_(config) {
  if (config.use_post_quant_conv)
    post_quant_conv_ = register_module("post_quant_conv", nn::Conv2d(config.latent_channels, config.latent_channels, 1));
  decoder_ = register_module("decoder", Decoder(config));
}

at::ScalarType VaeDecoderImpl::dtype() const { return parameters().front().scalar_type(); }

at::Device VaeDecoderImpl::device() const { return parameters().front().device(); }

at::Tensor VaeDecoderImpl::forward(const at::Tensor& z, DecoderTrace* trace) const {
  // z: [B, latent_channels, h, w]
  c10::InferenceMode guard;
  nn::ReuseLargeBlocks reuse;  // models/common/block_reuse.h: no page faults for each new activation
  nn::check_shape(z, {-1, config_.latent_channels, -1, -1}, "VAE decode input [B, latent_channels, h, w]");
  at::Tensor h = z.to(device(), dtype());
  if (post_quant_conv_) h = post_quant_conv_->forward(h);
  at::Tensor image = decoder_->forward(h, trace);
  // Recorded after the decoder, which starts its trace afresh.
  if (trace && post_quant_conv_) trace->post_quant_conv = h;
  return image;
}

at::Tensor VaeDecoderImpl::decode(const at::Tensor& z, const DecodeOptions& options) const {
  return decode_latents([this](const at::Tensor& x) { return forward(x); }, z, tile_geometry(config_), options);
}

void check_vae_switch(const io::ModelDir& model, const io::TensorStore& store, bool enabled, const char* key,
                      const std::string& tensor) {
  const bool present = store.contains(tensor);
  if (enabled == present) return;
  throw ConfigError(str_cat(model.label("vae/config.json"), ": '", key, "' is ", enabled ? "true" : "false",
                            " but the weights in '", store.dir(), "' ", present ? "have" : "have no", " '", tensor, "'"));
}

namespace {

// The two config switches that decide which tensors exist: a disagreement is reported against the
// config key rather than as an anonymous missing or unexpected tensor.
void check_vae_switches(const io::ModelDir& model, const io::VaeConfig& config, const io::TensorStore& store) {
  check_vae_switch(model, store, config.use_post_quant_conv, "use_post_quant_conv", "post_quant_conv.weight");
  check_vae_switch(model, store, config.mid_block_add_attention, "mid_block_add_attention",
                   "decoder.mid_block.attentions.0.to_q.weight");
}

nn::LoadRules vae_load_rules() {
  nn::LoadRules rules;
  // The encoder half of AutoencoderKL never runs in text-to-image inference.
  rules.skip_prefixes = {"encoder.", "quant_conv."};
  return rules;
}

}  // namespace

void check_vae_weights(const io::ModelDir& model) {
  const io::VaeConfig& config = model.vae_config();
  io::TensorStore store = model.open_weights("vae");
  check_vae_switches(model, config, store);
  // The module is built only for its parameter names and shapes (in the default dtype, for a
  // moment: the real FLUX decoder is ~200 MB in fp32, small next to the text encoders).
  VaeDecoder vae(config);
  nn::check_module(*vae, store, vae_load_rules());
}

VaeDecoder load_vae_decoder(const io::ModelDir& model, at::ScalarType dtype, at::Device device) {
  const io::VaeConfig& config = model.vae_config();
  io::TensorStore store = model.open_weights("vae");
  check_vae_switches(model, config, store);
  VaeDecoder vae(config);
  const nn::LoadRules rules = vae_load_rules();
  nn::LoadStats stats = nn::load_module(*vae, store, rules, dtype, device);
  log::debug("VAE decoder: ", stats.tensors, " tensors, ", stats.bytes, " bytes in ", nn::dtype_label(dtype));
  return vae;
}

}  // namespace fluxmpi::vae
