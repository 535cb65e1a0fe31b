// Semantics of diffusers UNetMidBlock2D (num_layers 1, resnet_time_scale_shift "default").
#include "models/vae/mid_block.h"

namespace fluxmpi::vae {

UNetMidBlock2DImpl::UNetMidBlock2DImpl(int64_t channels, int64_t groups, bool add_attention) {
  torch::nn::ModuleList resnets;
  for (int i = 0; i < 2; ++i) {
    resnets_.push_back(ResnetBlock2D(channels, channels, groups));
    resnets->push_back(resnets_.back());
  }
  register_module("resnets", resnets);
  // Without attention diffusers keeps a None placeholder: no parameters, no "attentions" keys.
  if (add_attention) {
    torch::nn::ModuleList attentions;
    attentions_.push_back(MidBlockAttention(channels, groups));
    attentions->push_back(attentions_.back());
    register_module("attentions", attentions);
  }
}

at::Tensor UNetMidBlock2DImpl::forward(const at::Tensor& x) const {
  // x: [B, C, H, W]
  at::Tensor h = resnets_[0]->forward(x);
  for (const auto& attention : attentions_) h = attention->forward(h);
  return resnets_[1]->forward(h);
}

}  // namespace fluxmpi::vae
