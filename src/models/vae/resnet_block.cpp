// Semantics of diffusers ResnetBlock2D (temb_channels = None, time_embedding_norm "default").
#include "models/vae/resnet_block.h"

#include "models/common/tensor_utils.h"
#include "models/vae/norm.h"

namespace fluxmpi::vae {

ResnetBlock2DImpl::ResnetBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t groups)
    : in_channels_(in_channels), out_channels_(out_channels) {
  norm1_ = register_module("norm1", nn::GroupNorm(groups, in_channels, kVaeNormEps));
  conv1_ = register_module("conv1", nn::Conv2d(in_channels, out_channels, 3));
  norm2_ = register_module("norm2", nn::GroupNorm(groups, out_channels, kVaeNormEps));
  conv2_ = register_module("conv2", nn::Conv2d(out_channels, out_channels, 3));
  if (in_channels != out_channels)
    conv_shortcut_ = register_module("conv_shortcut", nn::Conv2d(in_channels, out_channels, 1));
}

at::Tensor ResnetBlock2DImpl::forward(const at::Tensor& x) const {
  // x: [B, C_in, H, W]
  nn::check_shape(x, {-1, in_channels_, -1, -1}, "ResnetBlock2D input [B, C_in, H, W]");
  // Each SiLU runs with its group norm (norm.h) and the residual sum in place on a tensor made
  // here: at the VAE's large images a fresh tensor costs more in page faults than the arithmetic.
  at::Tensor h = conv1_->forward(group_norm_silu(norm1_, x));
  h = conv2_->forward(group_norm_silu(norm2_, h));
  // diffusers divides by output_scale_factor, which is 1 in the VAE: x / 1 is x, so it is omitted.
  return h.add_(conv_shortcut_ ? conv_shortcut_->forward(x) : x);
}

}  // namespace fluxmpi::vae
