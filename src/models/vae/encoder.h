#pragma once
/// The VAE encoder network (image -> moments). Semantics of diffusers Encoder (double_z = True):
/// conv_in, down_blocks over block_out_channels, mid_block, conv_norm_out, SiLU, conv_out to
/// 2 * latent_channels (mean | logvar).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "io/configs.h"
#include "models/common/layers.h"
#include "models/vae/down_block.h"
#include "models/vae/mid_block.h"

namespace fluxmpi::vae {

/// Intermediate activations of one encoder run, for parity tests and debugging.
struct EncoderTrace {
  at::Tensor conv_in;                   ///< [B, C_0, H, W]
  std::vector<at::Tensor> down_blocks;  ///< output of down_blocks.<i>, finest first
  at::Tensor mid_block;                 ///< [B, C_last, h, w]
  at::Tensor conv_norm_out;             ///< [B, C_last, h, w], before SiLU and conv_out
};

class EncoderImpl : public torch::nn::Module {
 public:
  explicit EncoderImpl(const io::VaeConfig& config);
  /// x: [B, in_channels, H, W] -> moments [B, 2 * latent_channels, h, w], each side halved (rounded
  /// down) once per level but the last: 40x56 -> 5x7 with 4 levels. Records intermediates into
  /// `trace` when given.
  at::Tensor forward(const at::Tensor& x, EncoderTrace* trace = nullptr) const;

 private:
  io::VaeConfig config_;
  nn::Conv2d conv_in_{nullptr};
  std::vector<DownEncoderBlock2D> down_blocks_;  ///< registered as down_blocks.<i>
  UNetMidBlock2D mid_block_{nullptr};
  nn::GroupNorm conv_norm_out_{nullptr};
  nn::Conv2d conv_out_{nullptr};
};
TORCH_MODULE(Encoder);

}  // namespace fluxmpi::vae
