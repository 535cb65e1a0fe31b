// Semantics of diffusers Encoder (autoencoders/vae.py) with DownEncoderBlock2D levels, double_z.
#include "models/vae/encoder.h"

#include "models/common/tensor_utils.h"

namespace fluxmpi::vae {

EncoderImpl::EncoderImpl(const io::VaeConfig& config) : config_(config) {
  const std::vector<int64_t>& channels = config.block_out_channels;
  const int64_t groups = config.norm_num_groups;
  conv_in_ = register_module("conv_in", nn::Conv2d(config.in_channels, channels.front(), 3));
  torch::nn::ModuleList down_blocks;
  int64_t previous = channels.front();
  const size_t levels = channels.size();
  for (size_t i = 0; i < levels; ++i) {
    const bool last = i + 1 == levels;
    // Unlike the decoder (layers_per_block + 1), each encoder level has layers_per_block resnets.
    down_blocks_.push_back(
        DownEncoderBlock2D(previous, channels[i], config.layers_per_block, groups, /*add_downsample=*/!last));
    down_blocks->push_back(down_blocks_.back());
    previous = channels[i];
  }
  register_module("down_blocks", down_blocks);
  const int64_t deepest = channels.back();
  mid_block_ = register_module("mid_block", UNetMidBlock2D(deepest, groups, config.mid_block_add_attention));
  conv_norm_out_ = register_module("conv_norm_out", nn::GroupNorm(groups, deepest, kVaeNormEps));
  conv_out_ = register_module("conv_out", nn::Conv2d(deepest, 2 * config.latent_channels, 3));
}

at::Tensor EncoderImpl::forward(const at::Tensor& x, EncoderTrace* trace) const {
  // x: [B, in_channels, H, W]
  nn::check_shape(x, {-1, config_.in_channels, -1, -1}, "VAE encoder input [B, in_channels, H, W]");
  if (trace) *trace = EncoderTrace{};
  at::Tensor h = conv_in_->forward(x);
  if (trace) trace->conv_in = h;
  for (const auto& block : down_blocks_) {
    h = block->forward(h);
    if (trace) trace->down_blocks.push_back(h);
  }
  h = mid_block_->forward(h);
  if (trace) trace->mid_block = h;
  h = conv_norm_out_->forward(h);
  if (trace) trace->conv_norm_out = h;
  return conv_out_->forward(at::silu(h));
}

}  // namespace fluxmpi::vae
