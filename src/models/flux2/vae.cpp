// Semantics of diffusers AutoencoderKLFlux2 (decode, the bn statistics) and of the decode tail of
// Flux2Pipeline.__call__ (unpack by ids, de-normalise, unpatchify, vae.decode).
#include "models/flux2/vae.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "models/common/layers.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "models/vae/image_processor.h"

namespace fluxmpi::flux2 {

namespace fs = std::filesystem;

namespace {

constexpr const char* kClassName = "AutoencoderKLFlux2";

std::string folder_label(const std::string& dir) { return str_cat("vae folder '", dir, "'"); }

// The keys whose AutoencoderKLFlux2 default differs from AutoencoderKL's (io::parse_vae_config
// fills absent keys with the latter).
nlohmann::json with_flux2_defaults(const nlohmann::json& config) {
  const nlohmann::json defaults = {{"block_out_channels", {128, 256, 512, 512}},
                                   {"layers_per_block", 2},
                                   {"latent_channels", 32},
                                   {"norm_num_groups", 32},
                                   {"sample_size", 1024}};
  nlohmann::json out = config;
  for (const auto& [key, value] : defaults.items())
    if (!out.contains(key)) out[key] = value;
  return out;
}

void check_store(const OpenedVae& v) {
  std::string missing;
  for (const char* key : {"bn.running_mean", "bn.running_var"})
    if (!v.store.contains(key)) missing += str_cat(missing.empty() ? "" : ", ", "'", key, "'");
  if (!missing.empty())
    throw WeightError(str_cat(v.store.label(), ": ", missing, " not found: the latent BatchNorm statistics of an ",
                              kClassName, " (a FLUX.1 AutoencoderKL has none)"));
  check_vae_switch(v, v.config.decoder.use_post_quant_conv, "use_post_quant_conv", "post_quant_conv.weight");
  check_vae_switch(v, v.config.decoder.mid_block_add_attention, "mid_block_add_attention",
                   "decoder.mid_block.attentions.0.to_q.weight");
}

// The decoder half: the encoder never runs in text-to-image inference; bn.* is the other pass's.
nn::LoadRules decoder_rules() {
  nn::LoadRules rules;
  rules.skip_prefixes = {"encoder.", "quant_conv.", "bn."};
  return rules;
}

}  // namespace

void check_vae_switch(const OpenedVae& v, bool enabled, const char* key, const std::string& tensor) {
  if (enabled == v.store.contains(tensor)) return;
  throw ConfigError(str_cat(v.config_label, ": '", key, "' is ", enabled ? "true" : "false", " but the weights in '",
                            v.store.dir(), "' ", enabled ? "have no" : "have", " '", tensor, "'"));
}

// The BatchNorm statistics: num_batches_tracked only counts training updates.
nn::LoadRules latent_stats_rules() {
  nn::LoadRules rules;
  rules.prefix = "bn.";
  rules.skip_prefixes = {"bn.num_batches_tracked"};
  rules.owned = [](const std::string& key) { return key.compare(0, 3, "bn.") == 0; };
  return rules;
}

OpenedVae open_flux2_vae(const std::string& dir) {
  const std::string label = folder_label(dir);
  const std::string config_label = label + ": config.json";
  VaeConfig config = parse_flux2_vae_config(io::ConfigReader::from_file((fs::path(dir) / "config.json").string(), config_label));
  OpenedVae v{std::move(config), config_label, io::TensorStore::open_dir(dir, label)};
  check_store(v);
  return v;
}

VaeConfig parse_flux2_vae_config(const io::ConfigReader& r) {
  const std::string cls = r.string("_class_name", "");
  if (cls != kClassName)
    r.fail("_class_name", str_cat(cls.empty() ? "is missing" : str_cat("is \"", cls, "\""), ", expected \"", kClassName,
                                  "\"",
                                  cls == "AutoencoderKL" ? " (a FLUX.1 VAE: it has no latent BatchNorm statistics "
                                                           "bn.running_mean / bn.running_var, which FLUX.2 needs)"
                                                         : ""));
  VaeConfig c;
  c.decoder = io::parse_vae_config(io::ConfigReader::from_text(with_flux2_defaults(r.json()).dump(), r.label()));
  c.batch_norm_eps = r.number("batch_norm_eps", c.batch_norm_eps);
  if (!(c.batch_norm_eps >= 0)) r.fail("batch_norm_eps", str_cat("must be >= 0, got ", c.batch_norm_eps));
  const std::vector<int64_t> patch = r.integer_list("patch_size", {2, 2}, 1);
  if (patch != std::vector<int64_t>{2, 2})
    r.fail("patch_size", "must be [2, 2] (the FLUX.2 pipelines (un)patchify latents in 2x2 patches)");
  c.patch_size = 2;
  if (r.has("decoder_block_out_channels"))
    r.fail("decoder_block_out_channels", "is set: a decoder wider or narrower than the encoder is not supported");
  c.use_quant_conv = r.boolean("use_quant_conv", c.use_quant_conv);
  return c;
}

vae::VaeEncoderConfig parse_flux2_vae_encoder_config(const io::ConfigReader& r) {
  parse_flux2_vae_config(r);  // the class and the decoder side first, as every FLUX.2 path reads them
  return vae::parse_vae_encoder_config(io::ConfigReader::from_text(with_flux2_defaults(r.json()).dump(), r.label()));
}

LatentStatsImpl::LatentStatsImpl(int64_t channels) {
  running_mean = register_parameter("running_mean", nn::placeholder({channels}), false);
  running_var = register_parameter("running_var", nn::placeholder({channels}), false);
}

Vae::Vae(const VaeConfig& config) : config_(config) {
  bn_ = LatentStats(config.patch_channels());
  decoder_ = vae::VaeDecoder(config.decoder);
}

at::Tensor Vae::bn_std() const { return bn_->std(config_.batch_norm_eps); }

at::Tensor Vae::denormalize(const at::Tensor& x) const {
  // x: [n, C, h2, w2]
  nn::check_shape(x, {-1, config_.patch_channels(), -1, -1}, "patchified latents [n, 4 * latent_channels, h/2, w/2]");
  const at::Tensor scale = bn_std().view({1, -1, 1, 1}).to(x.device(), x.scalar_type());
  const at::Tensor mean = bn_mean().view({1, -1, 1, 1}).to(x.device(), x.scalar_type());
  return x * scale + mean;
}

at::Tensor Vae::vae_input(const at::Tensor& packed, const at::Tensor& ids) const {
  // packed: [n, L, C]
  nn::check_shape(packed, {-1, -1, config_.patch_channels()}, "packed latents [n, L, 4 * latent_channels]");
  return unpatchify_latents(denormalize(unpack_latents_with_ids(packed, ids)));
}

at::Tensor Vae::decode(const at::Tensor& z, const vae::DecodeOptions& options) const {
  return decoder_->decode(z, options);
}

at::Tensor Vae::decode_traced(const at::Tensor& z, DecoderTrace* trace) const { return decoder_->forward(z, trace); }

std::vector<io::RgbImage> Vae::decode_images(const at::Tensor& packed, const at::Tensor& ids,
                                             const vae::DecodeOptions& options) const {
  return vae::to_rgb_images(decode(vae_input(packed, ids), options));
}

void check_vae(const std::string& vae_dir) {
  OpenedVae v = open_flux2_vae(vae_dir);
  Vae vae(v.config);
  nn::check_module(*vae.bn(), v.store, latent_stats_rules());
  nn::check_module(*vae.decoder(), v.store, decoder_rules());
}

Vae load_vae(const std::string& vae_dir, at::ScalarType dtype, at::Device device) {
  OpenedVae v = open_flux2_vae(vae_dir);
  Vae vae(v.config);
  // Both halves are checked before either is read, so a bad decoder is reported before any I/O.
  nn::check_module(*vae.bn(), v.store, latent_stats_rules());
  nn::check_module(*vae.decoder(), v.store, decoder_rules());
  const nn::LoadStats bn = nn::load_module(*vae.bn(), v.store, latent_stats_rules(), dtype, device);
  const nn::LoadStats dec = nn::load_module(*vae.decoder(), v.store, decoder_rules(), dtype, device);
  log::debug("FLUX.2 VAE: ", bn.tensors + dec.tensors, " tensors, ", bn.bytes + dec.bytes, " bytes in ",
             nn::dtype_label(dtype));
  return vae;
}

}  // namespace fluxmpi::flux2
