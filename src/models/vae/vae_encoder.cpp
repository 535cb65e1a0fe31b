// Semantics of diffusers AutoencoderKL.encode: the Encoder, quant_conv when the config enables it,
// then DiagonalGaussianDistribution (mean | logvar, logvar clamped to [-30, 20], std, sample, mode);
// the pipelines' (z - shift_factor) * scaling_factor. Tiling and slicing: encode_tiling.h.
#include "models/vae/vae_encoder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "models/common/block_reuse.h"
#include "models/vae/vae_decoder.h"

namespace fluxmpi::vae {

VaeEncoderConfig parse_vae_encoder_config(const io::ConfigReader& reader) {
  VaeEncoderConfig c;
  c.vae = io::parse_vae_config(reader);
  c.use_quant_conv = reader.boolean("use_quant_conv", c.use_quant_conv);
  const size_t levels = c.vae.block_out_channels.size();
  const auto down = reader.string_list("down_block_types", std::vector<std::string>(levels, "DownEncoderBlock2D"));
  if (down.size() != levels)
    reader.fail("down_block_types", str_cat("has ", down.size(), " entries but block_out_channels has ", levels));
  for (const auto& t : down)
    if (t != "DownEncoderBlock2D")
      reader.fail("down_block_types", str_cat("entries must be \"DownEncoderBlock2D\", got \"", t, "\""));
  return c;
}

LatentDistribution latent_distribution(const at::Tensor& moments) {
  // moments: [B, 2C, h, w]
  FLUX_CHECK(moments.dim() == 4 && moments.size(1) % 2 == 0, "VAE moments must be [B, 2C, h, w], got ",
             nn::shape_string(moments.sizes()));
  const int64_t C = moments.size(1) / 2;
  LatentDistribution d;
  d.mean = moments.narrow(1, 0, C);
  // The clamp keeps exp() finite for untrained or degenerate channels; it is part of the
  // distribution diffusers samples from, so it changes results only there.
  d.logvar = at::clamp(moments.narrow(1, C, C), -30.0, 20.0);
  d.std = at::exp(0.5 * d.logvar);
  return d;
}

at::Tensor LatentDistribution::sample(at::Generator& generator) const {
  // One draw of the whole [B, C, h, w] from the generator, as diffusers' randn_tensor with one
  // CPU generator: drawing per image or on the GPU would give other numbers.
  const at::Tensor noise = at::randn(mean.sizes(), generator, at::TensorOptions().dtype(mean.scalar_type()));
  return mean + std * noise.to(mean.device());
}

VaeEncoderImpl::VaeEncoderImpl(const VaeEncoderConfig& config) : config_(config) {
  encoder_ = register_module("encoder", Encoder(config.vae));
  const int64_t moments = 2 * config.vae.latent_channels;
  if (config.use_quant_conv) quant_conv_ = register_module("quant_conv", nn::Conv2d(moments, moments, 1));
}

at::ScalarType VaeEncoderImpl::dtype() const { return parameters().front().scalar_type(); }

at::Device VaeEncoderImpl::device() const { return parameters().front().device(); }

at::Tensor VaeEncoderImpl::moments(const at::Tensor& x, EncoderTrace* trace) const {
  // x: [B, in_channels, H, W]
  c10::InferenceMode guard;
  nn::ReuseLargeBlocks reuse;  // models/common/block_reuse.h: no page faults for each new activation
  nn::check_shape(x, {-1, config_.vae.in_channels, -1, -1}, "VAE encode input [B, in_channels, H, W]");
  at::Tensor h = encoder_->forward(x.to(device(), dtype()), trace);
  if (quant_conv_) h = quant_conv_->forward(h);
  return h;
}

LatentDistribution VaeEncoderImpl::encode(const at::Tensor& x, EncoderTrace* trace) const {
  return latent_distribution(moments(x, trace));
}

LatentDistribution VaeEncoderImpl::encode(const at::Tensor& x, const EncodeOptions& options) const {
  const EncodeTiles tiles{tile_geometry(config_.vae)};
  return latent_distribution(
      encode_moments([this](const at::Tensor& images) { return moments(images); }, x, tiles, options));
}

at::Tensor VaeEncoderImpl::normalize(const at::Tensor& z) const {
  // Subtract, then multiply, with the factors as Python floats: (z - 0.1159) * 0.3611 rounds
  // differently from z * 0.3611 - 0.1159 * 0.3611.
  return (z - config_.vae.shift_factor) * config_.vae.scaling_factor;
}

namespace {

// The encoder's tensors of an ae.safetensors file arrive under their LDM names: io/single_file.cpp
// maps only the decoder's to diffusers names, so say that rather than list every key as missing.
void check_not_ldm_encoder(const io::TensorStore& store) {
  for (const char* ldm : {"encoder.down.0.block.0.conv1.weight", "encoder.mid.attn_1.q.weight", "encoder.norm_out.weight"})
    if (store.contains(ldm))
      throw WeightError(str_cat(store.label(), ": the VAE encoder's tensors have LDM names ('", ldm,
                                "'); only diffusers names (encoder.down_blocks.*) can be loaded into the encoder"));
}

// The two config switches that decide which encoder tensors exist: a disagreement is reported
// against the config key rather than as an anonymous missing or unexpected tensor.
void check_encoder_switches(const io::ModelDir& model, const VaeEncoderConfig& config, const io::TensorStore& store) {
  check_vae_switch(model, store, config.use_quant_conv, "use_quant_conv", "quant_conv.weight");
  check_vae_switch(model, store, config.vae.mid_block_add_attention, "mid_block_add_attention",
                   "encoder.mid_block.attentions.0.to_q.weight");
}

nn::LoadRules vae_encoder_load_rules() {
  nn::LoadRules rules;
  // The decoder half is loaded (and accounted for) by load_vae_decoder.
  rules.skip_prefixes = {"decoder.", "post_quant_conv."};
  return rules;
}

VaeEncoderConfig encoder_config_of(const io::ModelDir& model) {
  return parse_vae_encoder_config(model.read_config("vae/config.json"));
}

}  // namespace

void check_vae_encoder_weights(const io::ModelDir& model) {
  const VaeEncoderConfig config = encoder_config_of(model);
  io::TensorStore store = model.open_weights("vae");
  check_not_ldm_encoder(store);
  check_encoder_switches(model, config, store);
  VaeEncoder vae(config);  // for its parameter names and shapes only: placeholders cost no memory
  nn::check_module(*vae, store, vae_encoder_load_rules());
}

VaeEncoder load_vae_encoder(const io::ModelDir& model, at::ScalarType dtype, at::Device device) {
  const VaeEncoderConfig config = encoder_config_of(model);
  io::TensorStore store = model.open_weights("vae");
  check_not_ldm_encoder(store);
  check_encoder_switches(model, config, store);
  VaeEncoder vae(config);
  nn::LoadStats stats = nn::load_module(*vae, store, vae_encoder_load_rules(), dtype, device);
  log::debug("VAE encoder: ", stats.tensors, " tensors, ", stats.bytes, " bytes in ", nn::dtype_label(dtype));
  return vae;
}

}  // namespace fluxmpi::vae
