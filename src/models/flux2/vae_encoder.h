#pragma once
/// The encode half of diffusers AutoencoderKLFlux2 as Flux2Pipeline runs it on its reference images
/// (_encode_vae_image): the FLUX.1 Encoder and quant_conv (vae::VaeEncoder), the latent
/// distribution's mode (sample_mode "argmax": nothing is drawn), the 2x2 patchify, then the
/// BatchNorm normalisation (z - running_mean) / sqrt(running_var + batch_norm_eps) per patchified
/// channel, the inverse of what flux2::Vae does before decoding. Parameter names are the diffusers
/// keys: encoder.*, quant_conv.*, bn.running_mean, bn.running_var.

#include <ATen/ATen.h>

#include <string>

#include "models/flux2/vae.h"
#include "models/vae/encode_tiling.h"
#include "models/vae/vae_encoder.h"

namespace fluxmpi::flux2 {

class VaeEncoder {
 public:
  explicit VaeEncoder(const VaeConfig& config, const vae::VaeEncoderConfig& encoder_config);

  /// image [n, 3, H, W] in [-1, 1] (H, W multiples of 2 x the scale factor) -> the normalised
  /// patchified latents [n, 4 latent_channels, H / (2 s), W / (2 s)] in the weights' dtype on their
  /// device; tiled and/or sliced as `options` say (AutoencoderKLFlux2.encode). `trace`: the
  /// encoder's intermediates (untiled only).
  at::Tensor encode(const at::Tensor& image, const vae::EncodeOptions& options = {},
                    vae::EncoderTrace* trace = nullptr) const;
  /// patchified latents [n, 4C, h, w] -> (z - mean) / std, the statistics cast to z's dtype and
  /// device as the pipeline casts them.
  at::Tensor normalize(const at::Tensor& patchified) const;

  const VaeConfig& config() const { return config_; }
  at::ScalarType dtype() const { return encoder_->dtype(); }
  at::Device device() const { return encoder_->device(); }
  /// Bytes of every parameter held (encoder, quant_conv, the statistics).
  int64_t parameter_bytes() const;
  vae::VaeEncoder& encoder() { return encoder_; }
  LatentStats& bn() { return bn_; }

 private:
  VaeConfig config_;
  LatentStats bn_{nullptr};             ///< keys bn.*
  vae::VaeEncoder encoder_{nullptr};    ///< keys encoder.*, quant_conv.*
};

/// Reads `vae_dir`/config.json and the encoder's weights (encoder.*, quant_conv.* when
/// use_quant_conv, bn.running_*) in `dtype` on `device`; the decoder's are skipped. A missing,
/// misshapen or unclaimed tensor is a WeightError naming key and folder; a config that disagrees
/// with the weights (use_quant_conv, mid_block_add_attention) a ConfigError naming the key; a
/// FLUX.1 AutoencoderKL one line saying so.
VaeEncoder load_vae_encoder(const std::string& vae_dir, at::ScalarType dtype, at::Device device);
/// The checks of load_vae_encoder from the config and the safetensors headers alone.
void check_vae_encoder(const std::string& vae_dir);

}  // namespace fluxmpi::flux2
