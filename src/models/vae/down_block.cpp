// Semantics of diffusers DownEncoderBlock2D and Downsample2D (use_conv=True, padding=0).
#include "models/vae/down_block.h"

#include "core/error.h"
#include "models/common/layers.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::vae {

Downsample2DImpl::Downsample2DImpl(int64_t channels) : channels_(channels) {
  conv_ = register_module("conv", nn::Conv2d(channels, channels, 3));
}

at::Tensor Downsample2DImpl::forward(const at::Tensor& x) const {
  // x: [B, C, H, W]
  nn::check_shape(x, {-1, channels_, -1, -1}, "Downsample2D input [B, C, H, W]");
  FLUX_CHECK(x.size(2) >= 2 && x.size(3) >= 2, "Downsample2D needs at least 2x2 pixels, got ", x.size(2), "x",
             x.size(3), " (the image is too small for the VAE's levels)");
  // The LDM encoders were trained with this asymmetric pad: a padding of 1 on every side would
  // move each output's 3x3 window one pixel up and left (and keep an odd side's last row).
  at::Tensor padded = at::constant_pad_nd(x, {0, 1, 0, 1}, 0);
  const int64_t stride[] = {2, 2}, no_padding[] = {0, 0};
  return nn::conv2d(padded, conv_->weight, conv_->bias, stride, no_padding);
}

DownEncoderBlock2DImpl::DownEncoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers,
                                               int64_t groups, bool add_downsample)
    : in_channels_(in_channels), out_channels_(out_channels) {
  torch::nn::ModuleList resnets;
  for (int64_t i = 0; i < num_layers; ++i) {
    resnets_.push_back(ResnetBlock2D(i == 0 ? in_channels : out_channels, out_channels, groups));
    resnets->push_back(resnets_.back());
  }
  register_module("resnets", resnets);
  if (add_downsample) {
    torch::nn::ModuleList downsamplers;
    downsamplers_.push_back(Downsample2D(out_channels));
    downsamplers->push_back(downsamplers_.back());
    register_module("downsamplers", downsamplers);
  }
}

at::Tensor DownEncoderBlock2DImpl::forward(const at::Tensor& x) const {
  // x: [B, C_in, H, W]
  nn::check_shape(x, {-1, in_channels_, -1, -1}, "DownEncoderBlock2D input [B, C_in, H, W]");
  at::Tensor h = x;
  for (const auto& resnet : resnets_) h = resnet->forward(h);
  for (const auto& downsampler : downsamplers_) h = downsampler->forward(h);
  return h;
}

}  // namespace fluxmpi::vae
