#pragma once
/// One resolution level of the VAE encoder. Semantics of diffusers DownEncoderBlock2D (resnets,
/// then an optional Downsample2D built with padding 0: zeros on the right and bottom, then a
/// stride-2 3x3 conv).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "models/common/layers.h"
#include "models/vae/resnet_block.h"

namespace fluxmpi::vae {

/// Pads one zero row at the bottom and one zero column on the right (F.pad (0, 1, 0, 1)), then a
/// 3x3 conv with stride 2 and no padding: H -> floor((H + 1 - 3) / 2) + 1 = floor(H / 2), so an odd
/// side loses its last row (5 -> 2). Parameters conv.weight, conv.bias (diffusers names the layer
/// "op" but stores it as conv).
class Downsample2DImpl : public torch::nn::Module {
 public:
  explicit Downsample2DImpl(int64_t channels);
  /// x: [B, C, H, W] with H, W >= 2 -> [B, C, H / 2, W / 2] (integer division)
  at::Tensor forward(const at::Tensor& x) const;

 private:
  int64_t channels_;
  nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(Downsample2D);

class DownEncoderBlock2DImpl : public torch::nn::Module {
 public:
  /// `num_layers` resnets (the first maps in_channels -> out_channels), then a downsampler when
  /// `add_downsample`.
  DownEncoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers, int64_t groups,
                         bool add_downsample);
  /// x: [B, C_in, H, W] -> [B, C_out, H, W], or Downsample2D's size with the downsampler.
  at::Tensor forward(const at::Tensor& x) const;

  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  bool downsamples() const { return !downsamplers_.empty(); }

 private:
  int64_t in_channels_, out_channels_;
  std::vector<ResnetBlock2D> resnets_;        ///< registered as resnets.<i>
  std::vector<Downsample2D> downsamplers_;    ///< 0 or 1, registered as downsamplers.0
};
TORCH_MODULE(DownEncoderBlock2D);

}  // namespace fluxmpi::vae
