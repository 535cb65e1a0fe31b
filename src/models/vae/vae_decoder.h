#pragma once
/// The decode half of diffusers AutoencoderKL, the only part of the VAE that FLUX inference runs:
/// optional post_quant_conv, then the Decoder. Parameter names are the diffusers keys
/// (post_quant_conv.weight, decoder.conv_in.weight, decoder.up_blocks.0.resnets.1.conv1.weight, ...).

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "io/configs.h"
#include "io/model_dir.h"
#include "models/common/layers.h"
#include "models/vae/decoder.h"
#include "models/vae/tiling.h"

namespace fluxmpi::vae {

class VaeDecoderImpl : public torch::nn::Module {
 public:
  explicit VaeDecoderImpl(const io::VaeConfig& config);
  /// z: [B, latent_channels, h, w] (already / scaling_factor + shift_factor) ->
  /// image [B, out_channels, h * scale_factor, w * scale_factor], nominal range [-1, 1], not clamped.
  /// Runs under c10::InferenceMode; z is converted to the weights' dtype and device. Records the
  /// decoder's intermediates into `trace` when given.
  at::Tensor forward(const at::Tensor& z, DecoderTrace* trace = nullptr) const;
  /// forward() applied as diffusers AutoencoderKL.decode with enable_tiling / enable_slicing:
  /// tiles of tile_geometry(config()) when `options.tiling` and the latent exceeds one tile,
  /// one image at a time when `options.slicing`.
  at::Tensor decode(const at::Tensor& z, const DecodeOptions& options) const;

  const io::VaeConfig& config() const { return config_; }
  /// dtype of the loaded weights (the run dtype).
  at::ScalarType dtype() const;
  at::Device device() const;

 private:
  io::VaeConfig config_;
  nn::Conv2d post_quant_conv_{nullptr};  ///< only when config.use_post_quant_conv
  Decoder decoder_{nullptr};
};
TORCH_MODULE(VaeDecoder);

/// Checks vae/'s weights against vae/config.json from the safetensors headers alone (every
/// malformed header, missing, unexpected or misshapen tensor is a WeightError or ConfigError), so
/// A config switch that decides whether `tensor` exists (use_post_quant_conv, use_quant_conv,
/// mid_block_add_attention): a disagreement with the weights is a ConfigError naming
/// vae/config.json and the key, not an anonymous missing or unexpected tensor.
void check_vae_switch(const io::ModelDir& model, const io::TensorStore& store, bool enabled, const char* key,
                      const std::string& tensor);

/// a broken VAE is found before any heavy work rather than after the denoising loop.
void check_vae_weights(const io::ModelDir& model);

/// Builds the decoder from `model`'s vae/config.json and loads its weights from vae/ in `dtype` on
/// `device`. The encoder's tensors (encoder.*, quant_conv.*) are skipped; any other tensor no
/// parameter claims, a missing tensor or a wrong shape is a WeightError naming key and file; a
/// config that disagrees with the weights about post_quant_conv or the mid-block attention is a
/// ConfigError naming vae/config.json and the key.
VaeDecoder load_vae_decoder(const io::ModelDir& model, at::ScalarType dtype, at::Device device);

}  // namespace fluxmpi::vae
