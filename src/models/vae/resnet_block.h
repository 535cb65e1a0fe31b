#pragma once
/// The residual block of the VAE decoder. Semantics of diffusers ResnetBlock2D as the decoder
/// builds it: no time embedding, GroupNorm eps 1e-6, SiLU, output_scale_factor 1, dropout 0.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "models/common/layers.h"

namespace fluxmpi::vae {

/// GroupNorm eps of every norm in the decoder (diffusers hard-codes it for the VAE).
inline constexpr double kVaeNormEps = 1e-6;

/// norm1 -> SiLU -> conv1 -> norm2 -> SiLU -> conv2, plus the input (through a 1x1
/// conv_shortcut when the channel count changes).
class ResnetBlock2DImpl : public torch::nn::Module {
 public:
  ResnetBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t groups);
  /// x: [B, C_in, H, W] -> [B, C_out, H, W]
  at::Tensor forward(const at::Tensor& x) const;

  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }

 private:
  int64_t in_channels_, out_channels_;
  nn::GroupNorm norm1_{nullptr}, norm2_{nullptr};
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::Conv2d conv_shortcut_{nullptr};  ///< only when in_channels != out_channels
};
TORCH_MODULE(ResnetBlock2D);

}  // namespace fluxmpi::vae
