#pragma once
/// The decoder's middle block at the lowest resolution. Semantics of diffusers UNetMidBlock2D as
/// the VAE decoder builds it: resnet, attention (when mid_block_add_attention), resnet; no time
/// embedding, channels kept.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "models/vae/mid_block_attention.h"
#include "models/vae/resnet_block.h"

namespace fluxmpi::vae {

class UNetMidBlock2DImpl : public torch::nn::Module {
 public:
  UNetMidBlock2DImpl(int64_t channels, int64_t groups, bool add_attention);
  /// x: [B, C, H, W] -> [B, C, H, W]
  at::Tensor forward(const at::Tensor& x) const;

 private:
  std::vector<ResnetBlock2D> resnets_;         ///< 2, registered as resnets.0, resnets.1
  std::vector<MidBlockAttention> attentions_;  ///< 0 or 1, registered as attentions.0
};
TORCH_MODULE(UNetMidBlock2D);

}  // namespace fluxmpi::vae
