#pragma once
/// The VAE decoder network (latents -> image). Semantics of diffusers Decoder (norm_type "group"):
/// conv_in, mid_block, up_blocks over reversed(block_out_channels), conv_norm_out, SiLU, conv_out.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "io/configs.h"
#include "models/common/layers.h"
#include "models/vae/mid_block.h"
#include "models/vae/up_block.h"

namespace fluxmpi::vae {

/// Intermediate activations of one decoder run, for parity tests and debugging.
struct DecoderTrace {
  at::Tensor post_quant_conv;          ///< [B, latent_channels, h, w]; set by VaeDecoder when it has one
  at::Tensor conv_in;                  ///< [B, C_last, h, w]
  at::Tensor mid_block;                ///< [B, C_last, h, w]
  std::vector<at::Tensor> up_blocks;   ///< output of up_blocks.<i>, deepest first
  at::Tensor conv_norm_out;            ///< [B, C_0, H, W], before SiLU and conv_out
};

class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const io::VaeConfig& config);
  /// z: [B, latent_channels, h, w] -> [B, out_channels, h * 2^(levels-1), w * 2^(levels-1)].
  /// Records intermediates into `trace` when given.
  at::Tensor forward(const at::Tensor& z, DecoderTrace* trace = nullptr) const;

 private:
  io::VaeConfig config_;
  nn::Conv2d conv_in_{nullptr};
  UNetMidBlock2D mid_block_{nullptr};
  std::vector<UpDecoderBlock2D> up_blocks_;  ///< registered as up_blocks.<i>
  nn::GroupNorm conv_norm_out_{nullptr};
  nn::Conv2d conv_out_{nullptr};
};
TORCH_MODULE(Decoder);

}  // namespace fluxmpi::vae
