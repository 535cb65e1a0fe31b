// Semantics of diffusers UpDecoderBlock2D and Upsample2D (interpolate "nearest", scale 2, then conv).
#include "models/vae/up_block.h"

#include "models/common/tensor_utils.h"
#include "models/vae/upsample_conv.h"

namespace fluxmpi::vae {

Upsample2DImpl::Upsample2DImpl(int64_t channels) : channels_(channels) {
  conv_ = register_module("conv", nn::Conv2d(channels, channels, 3));
}

at::Tensor Upsample2DImpl::forward(const at::Tensor& x) const {
  // x: [B, C, H, W]
  nn::check_shape(x, {-1, channels_, -1, -1}, "Upsample2D input [B, C, H, W]");
  // Nearest-neighbour doubling then the 3x3 conv, as four 2x2 convs at x's resolution
  // (upsample_conv.h). diffusers upcasts bf16 around its interpolation; there is none here.
  return upsample2x_conv3x3(x, conv_->weight, conv_->bias);
}

UpDecoderBlock2DImpl::UpDecoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers,
                                           int64_t groups, bool add_upsample)
    : in_channels_(in_channels), out_channels_(out_channels) {
  torch::nn::ModuleList resnets;
  for (int64_t i = 0; i < num_layers; ++i) {
    resnets_.push_back(ResnetBlock2D(i == 0 ? in_channels : out_channels, out_channels, groups));
    resnets->push_back(resnets_.back());
  }
  register_module("resnets", resnets);
  if (add_upsample) {
    torch::nn::ModuleList upsamplers;
    upsamplers_.push_back(Upsample2D(out_channels));
    upsamplers->push_back(upsamplers_.back());
    register_module("upsamplers", upsamplers);
  }
}

at::Tensor UpDecoderBlock2DImpl::forward(const at::Tensor& x) const {
  // x: [B, C_in, H, W]
  nn::check_shape(x, {-1, in_channels_, -1, -1}, "UpDecoderBlock2D input [B, C_in, H, W]");
  at::Tensor h = x;
  for (const auto& resnet : resnets_) h = resnet->forward(h);
  for (const auto& upsampler : upsamplers_) h = upsampler->forward(h);
  return h;
}

}  // namespace fluxmpi::vae
