// Semantics of diffusers Decoder (autoencoders/vae.py) with norm_type "group" and no latent_embeds.
#include "models/vae/decoder.h"

#include "models/common/tensor_utils.h"
#include "models/vae/norm.h"

namespace fluxmpi::vae {

DecoderImpl::DecoderImpl(const io::VaeConfig& config) : config_(config) {
  const std::vector<int64_t>& channels = config.block_out_channels;
  const int64_t groups = config.norm_num_groups;
  const int64_t deepest = channels.back();
  conv_in_ = register_module("conv_in", nn::Conv2d(config.latent_channels, deepest, 3));
  mid_block_ = register_module("mid_block", UNetMidBlock2D(deepest, groups, config.mid_block_add_attention));
  torch::nn::ModuleList up_blocks;
  int64_t previous = deepest;
  const int64_t levels = static_cast<int64_t>(channels.size());
  for (int64_t i = 0; i < levels; ++i) {
    const int64_t out = channels[levels - 1 - i];
    const bool last = i == levels - 1;
    up_blocks_.push_back(UpDecoderBlock2D(previous, out, config.layers_per_block + 1, groups, /*add_upsample=*/!last));
    up_blocks->push_back(up_blocks_.back());
    previous = out;
  }
  register_module("up_blocks", up_blocks);
  conv_norm_out_ = register_module("conv_norm_out", nn::GroupNorm(groups, channels.front(), kVaeNormEps));
  conv_out_ = register_module("conv_out", nn::Conv2d(channels.front(), config.out_channels, 3));
}

at::Tensor DecoderImpl::forward(const at::Tensor& z, DecoderTrace* trace) const {
  // z: [B, latent_channels, h, w]
  nn::check_shape(z, {-1, config_.latent_channels, -1, -1}, "VAE decoder input [B, latent_channels, h, w]");
  if (trace) *trace = DecoderTrace{};
  // Channels-last from the first conv on: oneDNN's convolutions read and write it without
  // reordering (NCHW costs a reorder of each input and output), and so do the group norms, SiLU
  // and the residual sums; the image is made contiguous again at the end.
  at::Tensor h = conv_in_->forward(z.contiguous(at::MemoryFormat::ChannelsLast));
  if (trace) trace->conv_in = h;
  h = mid_block_->forward(h);
  if (trace) trace->mid_block = h;
  for (const auto& block : up_blocks_) {
    h = block->forward(h);
    if (trace) trace->up_blocks.push_back(h);
  }
  if (trace) {
    trace->conv_norm_out = group_norm(conv_norm_out_, h);
    h = at::silu(trace->conv_norm_out);
  } else {
    h = group_norm_silu(conv_norm_out_, h);
  }
  return conv_out_->forward(h).contiguous();
}

}  // namespace fluxmpi::vae
