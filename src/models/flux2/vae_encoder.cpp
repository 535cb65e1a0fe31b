// Semantics of diffusers AutoencoderKLFlux2.encode and Flux2Pipeline._encode_vae_image (retrieve_latents
// with sample_mode "argmax", _patchify_latents, the BatchNorm normalisation).
#include "models/flux2/vae_encoder.h"

#include <c10/core/InferenceMode.h>

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "models/flux2/latents.h"

namespace fluxmpi::flux2 {

namespace fs = std::filesystem;

namespace {

// The encoder half: the decoder's tensors belong to Vae, the statistics are loaded on their own.
nn::LoadRules encoder_rules() {
  nn::LoadRules rules;
  rules.skip_prefixes = {"decoder.", "post_quant_conv.", "bn."};
  return rules;
}

struct Opened {
  OpenedVae vae;
  vae::VaeEncoderConfig encoder;
};

Opened open_encoder(const std::string& dir) {
  OpenedVae v = open_flux2_vae(dir);
  vae::VaeEncoderConfig e = parse_flux2_vae_encoder_config(
      io::ConfigReader::from_file((fs::path(dir) / "config.json").string(), v.config_label));
  check_vae_switch(v, e.use_quant_conv, "use_quant_conv", "quant_conv.weight");
  check_vae_switch(v, e.vae.mid_block_add_attention, "mid_block_add_attention", "encoder.mid_block.attentions.0.to_q.weight");
  return {std::move(v), std::move(e)};
}

void check_modules(VaeEncoder& encoder, const io::TensorStore& store) {
  nn::check_module(*encoder.bn(), store, latent_stats_rules());
  nn::check_module(*encoder.encoder(), store, encoder_rules());
}

}  // namespace

VaeEncoder::VaeEncoder(const VaeConfig& config, const vae::VaeEncoderConfig& encoder_config) : config_(config) {
  bn_ = LatentStats(config.patch_channels());
  encoder_ = vae::VaeEncoder(encoder_config);
}

at::Tensor VaeEncoder::encode(const at::Tensor& image, const vae::EncodeOptions& options, vae::EncoderTrace* trace) const {
  // image: [n, 3, H, W]
  c10::InferenceMode guard;
  const vae::LatentDistribution dist = trace != nullptr ? encoder_->encode(image, trace) : encoder_->encode(image, options);
  return normalize(patchify_latents(dist.mode()));
}

at::Tensor VaeEncoder::normalize(const at::Tensor& z) const {
  // z: [n, 4C, h, w]
  nn::check_shape(z, {-1, config_.patch_channels(), -1, -1}, "patchified latents [n, 4 * latent_channels, h, w]");
  const at::Tensor mean = bn_->running_mean.view({1, -1, 1, 1}).to(z.device(), z.scalar_type());
  const at::Tensor std = bn_->std(config_.batch_norm_eps).view({1, -1, 1, 1}).to(z.device(), z.scalar_type());
  return (z - mean) / std;
}

int64_t VaeEncoder::parameter_bytes() const { return nn::parameter_bytes(*encoder_) + nn::parameter_bytes(*bn_); }

void check_vae_encoder(const std::string& vae_dir) {
  Opened o = open_encoder(vae_dir);
  VaeEncoder encoder(o.vae.config, o.encoder);  // placeholders: names and shapes only
  check_modules(encoder, o.vae.store);
}

VaeEncoder load_vae_encoder(const std::string& vae_dir, at::ScalarType dtype, at::Device device) {
  Opened o = open_encoder(vae_dir);
  VaeEncoder encoder(o.vae.config, o.encoder);
  check_modules(encoder, o.vae.store);
  const nn::LoadStats bn = nn::load_module(*encoder.bn(), o.vae.store, latent_stats_rules(), dtype, device);
  const nn::LoadStats enc = nn::load_module(*encoder.encoder(), o.vae.store, encoder_rules(), dtype, device);
  log::debug("FLUX.2 VAE encoder: ", bn.tensors + enc.tensors, " tensors, ", bn.bytes + enc.bytes, " bytes in ",
             nn::dtype_label(dtype));
  return encoder;
}

}  // namespace fluxmpi::flux2
