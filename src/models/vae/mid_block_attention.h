#pragma once
/// Self-attention over the pixels of the decoder's lowest resolution. Semantics of diffusers
/// Attention as UNetMidBlock2D builds it for the VAE: GroupNorm (eps 1e-6), one head spanning all
/// channels, biased q/k/v/out projections, residual connection, rescale_output_factor 1.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "models/common/layers.h"

namespace fluxmpi::vae {

/// Large images process the queries in chunks whose score matrix stays within
/// nn::kAttentionChunkBytes: a 1024x1024 image has 128x128 pixels at this level, a 1 GiB fp32 score
/// matrix per image.
class MidBlockAttentionImpl : public torch::nn::Module {
 public:
  MidBlockAttentionImpl(int64_t channels, int64_t groups);
  /// x: [B, C, H, W] -> [B, C, H, W]
  at::Tensor forward(const at::Tensor& x) const;

 private:
  int64_t channels_;
  nn::GroupNorm group_norm_{nullptr};
  nn::Linear to_q_{nullptr}, to_k_{nullptr}, to_v_{nullptr};
  nn::Linear to_out_0_{nullptr};  ///< registered inside the list "to_out" (diffusers key to_out.0)
};
TORCH_MODULE(MidBlockAttention);

}  // namespace fluxmpi::vae
