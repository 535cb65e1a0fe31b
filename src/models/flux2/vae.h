#pragma once
/// The decode half of diffusers AutoencoderKLFlux2, as Flux2Pipeline runs it after denoising:
/// packed latents -> unpack by position ids -> de-normalise with the BatchNorm running statistics
/// (z * sqrt(running_var + batch_norm_eps) + running_mean per patchified channel) -> unpatchify ->
/// post_quant_conv -> the FLUX.1 Decoder. post_quant_conv and the Decoder are vae::VaeDecoder, so
/// tiling and slicing (vae/tiling.h) apply unchanged to the unpatchified latents. Parameter names
/// are the diffusers keys: bn.running_mean, bn.running_var, post_quant_conv.weight, decoder.*.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "io/configs.h"
#include "io/json_config.h"
#include "io/png.h"
#include "io/tensor_store.h"
#include "models/common/loader.h"
#include "models/flux2/latents.h"
#include "models/vae/vae_decoder.h"
#include "models/vae/vae_encoder.h"

namespace fluxmpi::flux2 {

/// AutoencoderKLFlux2 arguments of the decode path: AutoencoderKL's (the same Decoder) plus the
/// latent BatchNorm's eps and the 2x2 patch size.
struct VaeConfig {
  io::VaeConfig decoder;         ///< latent_channels, block_out_channels, ... (scaling/shift factors unused)
  double batch_norm_eps = 1e-4;
  int64_t patch_size = 2;        ///< config patch_size [2, 2]; the pipeline's (un)patchify is 2x2 only
  bool use_quant_conv = true;    ///< the encoder's 1x1 conv over the moments (AutoencoderKLFlux2's default)

  /// Channels of a patchified latent (= the BatchNorm's channels = transformer in_channels).
  int64_t patch_channels() const { return decoder.latent_channels * patch_size * patch_size; }
  /// Pixels per VAE latent cell (vae_scale_factor): 2^(levels - 1).
  int64_t scale_factor() const { return decoder.scale_factor(); }
};
/// Parses vae/config.json of an AutoencoderKLFlux2 (a ConfigError naming the file and key
/// otherwise, e.g. for a FLUX.1 AutoencoderKL).
VaeConfig parse_flux2_vae_config(const io::ConfigReader& reader);
/// The encoder's config of the same file (vae::parse_vae_encoder_config with AutoencoderKLFlux2's
/// defaults: down_block_types checked, use_quant_conv).
vae::VaeEncoderConfig parse_flux2_vae_encoder_config(const io::ConfigReader& reader);

/// The BatchNorm2d(affine=False) in front of the latents: inference reads its running statistics
/// only. They are registered as (frozen) parameters so that the one loader takes them by name.
class LatentStatsImpl : public torch::nn::Module {
 public:
  explicit LatentStatsImpl(int64_t channels);
  /// sqrt(running_var + eps) [C], in the statistics' dtype (as the pipelines compute it).
  at::Tensor std(double eps) const { return at::sqrt(running_var + eps); }
  at::Tensor running_mean;  ///< [C]
  at::Tensor running_var;   ///< [C]
};
TORCH_MODULE(LatentStats);
/// How the loader takes bn.running_mean / bn.running_var (bn.num_batches_tracked skipped).
nn::LoadRules latent_stats_rules();
/// vae/ of an AutoencoderKLFlux2 folder: its config, checked against the weights' headers
/// (the BatchNorm statistics present, use_post_quant_conv and mid_block_add_attention as the
/// tensors say).
struct OpenedVae {
  VaeConfig config;
  std::string config_label;  ///< "vae folder '<dir>': config.json"
  io::TensorStore store;
};
OpenedVae open_flux2_vae(const std::string& vae_dir);
/// A config switch that decides whether `tensor` exists: a disagreement is a ConfigError naming
/// the config key.
void check_vae_switch(const OpenedVae& vae, bool enabled, const char* key, const std::string& tensor);

/// Intermediates of decode_traced(): the decoder's (vae::DecoderTrace, post_quant_conv included).
using vae::DecoderTrace;

class Vae {
 public:
  explicit Vae(const VaeConfig& config);

  /// sqrt(running_var + batch_norm_eps) [C], in the weights' dtype.
  at::Tensor bn_std() const;
  at::Tensor bn_mean() const { return bn_->running_mean; }

  /// patchified [n, C, h2, w2] -> patchified * bn_std + bn_mean, in the dtype and on the device of
  /// `patchified` (the statistics are cast to it, as the pipeline does).
  at::Tensor denormalize(const at::Tensor& patchified) const;
  /// Everything before the VAE proper: packed [n, L, C] with their ids ([L, 4] or [n, L, 4]) ->
  /// vae input [n, latent_channels, h, w] (unpack by ids, de-normalise, unpatchify).
  at::Tensor vae_input(const at::Tensor& packed, const at::Tensor& ids) const;
  /// vae input [n, latent_channels, h, w] -> image [n, 3, h * s, w * s] (nominal [-1, 1], not
  /// clamped), tiled and/or sliced as `options` say (diffusers AutoencoderKLFlux2.decode).
  at::Tensor decode(const at::Tensor& z, const vae::DecodeOptions& options = {}) const;
  /// One untiled pass recording the intermediates (parity tests).
  at::Tensor decode_traced(const at::Tensor& z, DecoderTrace* trace) const;
  /// packed latents and ids -> the pipeline's 8-bit RGB images (VaeImageProcessor.postprocess).
  std::vector<io::RgbImage> decode_images(const at::Tensor& packed, const at::Tensor& ids,
                                          const vae::DecodeOptions& options = {}) const;

  const VaeConfig& config() const { return config_; }
  at::ScalarType dtype() const { return decoder_->dtype(); }
  at::Device device() const { return decoder_->device(); }
  LatentStats& bn() { return bn_; }
  vae::VaeDecoder& decoder() { return decoder_; }

 private:
  VaeConfig config_;
  LatentStats bn_{nullptr};           ///< keys bn.*
  vae::VaeDecoder decoder_{nullptr};  ///< keys post_quant_conv.*, decoder.*
};

/// Reads `vae_dir`/config.json and the weights of `vae_dir` (a diffusers AutoencoderKLFlux2 folder)
/// in `dtype` on `device`. encoder.*, quant_conv.* and bn.num_batches_tracked are skipped; a
/// missing, misshapen or unclaimed tensor is a WeightError naming key and folder; a FLUX.1 VAE
/// (AutoencoderKL, no bn.*) is one ConfigError / WeightError line saying so.
Vae load_vae(const std::string& vae_dir, at::ScalarType dtype, at::Device device);
/// The checks of load_vae from the config and the safetensors headers alone (no tensor is read).
void check_vae(const std::string& vae_dir);

}  // namespace fluxmpi::flux2
