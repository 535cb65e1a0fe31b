#pragma once
/// The encode half of diffusers AutoencoderKL, which the image-conditioned pipelines run (img2img,
/// inpaint, Fill, Control, Kontext): the Encoder, quant_conv when the config enables it, and the
/// diagonal Gaussian over the latents. Parameter names are the diffusers keys (quant_conv.weight,
/// encoder.conv_in.weight, encoder.down_blocks.0.downsamplers.0.conv.weight, ...).

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "io/configs.h"
#include "io/model_dir.h"
#include "models/common/layers.h"
#include "models/vae/encoder.h"
#include "models/vae/encode_tiling.h"

namespace fluxmpi::vae {

/// vae/config.json as the encoder reads it: io::VaeConfig (which describes the decoder side) plus
/// the keys only the encoder uses.
struct VaeEncoderConfig {
  io::VaeConfig vae;
  /// diffusers' use_quant_conv (default true; FLUX.1: false): a 1x1 conv over the moments.
  bool use_quant_conv = true;
};
/// Parses `reader` (vae/config.json): io::parse_vae_config, use_quant_conv, and down_block_types,
/// which must be one "DownEncoderBlock2D" per level (ConfigError naming the file and key otherwise).
VaeEncoderConfig parse_vae_encoder_config(const io::ConfigReader& reader);

/// What AutoencoderKL.encode returns (diffusers DiagonalGaussianDistribution), in the run dtype on
/// the encoder's device. All [B, latent_channels, h, w].
struct LatentDistribution {
  at::Tensor mean;
  at::Tensor logvar;  ///< clamped to [-30, 20]
  at::Tensor std;     ///< exp(0.5 * logvar)

  /// mean + std * randn(mean.shape, generator): one draw for the whole batch, made on the CPU in
  /// mean's dtype (as diffusers' randn_tensor does with a CPU generator), then moved to mean's
  /// device. `generator` is a CPU generator (at::make_generator<at::CPUGeneratorImpl>(seed)),
  /// shared with the pipeline's other draws: this draw advances it.
  at::Tensor sample(at::Generator& generator) const;
  /// The mean (Kontext's sample_mode "argmax"): no draw.
  const at::Tensor& mode() const { return mean; }
};
/// moments [B, 2C, h, w] -> mean = channels [0, C), logvar = channels [C, 2C) clamped, std.
LatentDistribution latent_distribution(const at::Tensor& moments);

class VaeEncoderImpl : public torch::nn::Module {
 public:
  explicit VaeEncoderImpl(const VaeEncoderConfig& config);
  /// x: [B, in_channels, H, W] in [-1, 1] -> moments [B, 2 * latent_channels, h, w] (Encoder, then
  /// quant_conv): diffusers AutoencoderKL._encode without tiling. Runs under c10::InferenceMode; x
  /// is converted to the weights' dtype and device. Records the encoder's intermediates into
  /// `trace` when given.
  at::Tensor moments(const at::Tensor& x, EncoderTrace* trace = nullptr) const;
  /// AutoencoderKL.encode(x).latent_dist, untiled and unsliced.
  LatentDistribution encode(const at::Tensor& x, EncoderTrace* trace = nullptr) const;
  /// AutoencoderKL.encode with enable_tiling / enable_slicing (encode_tiling.h): with
  /// `options.tiling`, an image larger than tile_geometry(config) in some side is encoded in tiles
  /// whose moments are blended; with `options.slicing`, one image of the batch at a time.
  LatentDistribution encode(const at::Tensor& x, const EncodeOptions& options) const;
  /// (z - shift_factor) * scaling_factor: what the pipelines keep of a sample or the mode (the
  /// inverse of what the decoder gets, z / scaling_factor + shift_factor).
  at::Tensor normalize(const at::Tensor& z) const;

  const VaeEncoderConfig& config() const { return config_; }
  /// dtype of the loaded weights (the run dtype).
  at::ScalarType dtype() const;
  at::Device device() const;

 private:
  VaeEncoderConfig config_;
  Encoder encoder_{nullptr};
  nn::Conv2d quant_conv_{nullptr};  ///< only when config.use_quant_conv
};
TORCH_MODULE(VaeEncoder);

/// Checks vae/'s encoder weights against vae/config.json from the safetensors headers alone, as
/// load_vae_encoder would (same errors), reading no tensor data.
void check_vae_encoder_weights(const io::ModelDir& model);

/// Builds the encoder from `model`'s vae/config.json and loads encoder.* (and quant_conv.* when
/// use_quant_conv) from vae/ in `dtype` on `device`; the decoder's tensors (decoder.*,
/// post_quant_conv.*) are skipped. A missing tensor, a wrong shape or another tensor no parameter
/// claims is a WeightError naming key and file; a config that disagrees with the weights about
/// quant_conv or the mid-block attention is a ConfigError naming vae/config.json and the key.
VaeEncoder load_vae_encoder(const io::ModelDir& model, at::ScalarType dtype, at::Device device);

}  // namespace fluxmpi::vae
