#pragma once
/// One resolution level of the VAE decoder. Semantics of diffusers UpDecoderBlock2D (resnets, then
/// an optional Upsample2D with a 3x3 conv after nearest-neighbour doubling).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "models/common/layers.h"
#include "models/vae/resnet_block.h"

namespace fluxmpi::vae {

/// Nearest-neighbour x2 upsampling followed by a 3x3 conv (diffusers Upsample2D, use_conv=True).
class Upsample2DImpl : public torch::nn::Module {
 public:
  explicit Upsample2DImpl(int64_t channels);
  /// x: [B, C, H, W] -> [B, C, 2H, 2W]
  at::Tensor forward(const at::Tensor& x) const;

 private:
  int64_t channels_;
  nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(Upsample2D);

class UpDecoderBlock2DImpl : public torch::nn::Module {
 public:
  /// `num_layers` resnets (the first maps in_channels -> out_channels), then an upsampler when
  /// `add_upsample`.
  UpDecoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers, int64_t groups,
                       bool add_upsample);
  /// x: [B, C_in, H, W] -> [B, C_out, H, W], or [B, C_out, 2H, 2W] with the upsampler.
  at::Tensor forward(const at::Tensor& x) const;

  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  bool upsamples() const { return !upsamplers_.empty(); }

 private:
  int64_t in_channels_, out_channels_;
  std::vector<ResnetBlock2D> resnets_;    ///< registered as resnets.<i>
  std::vector<Upsample2D> upsamplers_;    ///< 0 or 1, registered as upsamplers.0
};
TORCH_MODULE(UpDecoderBlock2D);

}  // namespace fluxmpi::vae
