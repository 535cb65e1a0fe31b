// Semantics of diffusers Attention with AttnProcessor2_0 on 4-D input, as in the VAE mid block.
#include "models/vae/mid_block_attention.h"

#include <algorithm>

#include "models/common/attention.h"
#include "models/common/tensor_utils.h"
#include "models/vae/norm.h"
#include "models/vae/resnet_block.h"

namespace fluxmpi::vae {

MidBlockAttentionImpl::MidBlockAttentionImpl(int64_t channels, int64_t groups) : channels_(channels) {
  group_norm_ = register_module("group_norm", nn::GroupNorm(groups, channels, kVaeNormEps));
  to_q_ = register_module("to_q", nn::Linear(channels, channels));
  to_k_ = register_module("to_k", nn::Linear(channels, channels));
  to_v_ = register_module("to_v", nn::Linear(channels, channels));
  to_out_0_ = nn::Linear(channels, channels);
  // diffusers' to_out is [Linear, Dropout]; the dropout has no parameters and is the identity here.
  register_module("to_out", torch::nn::ModuleList(to_out_0_));
}

at::Tensor MidBlockAttentionImpl::forward(const at::Tensor& x) const {
  // x: [B, C, H, W]; the pixels are the tokens: [B, HW, C], one head of width C.
  nn::check_shape(x, {-1, channels_, -1, -1}, "VAE mid-block attention input [B, C, H, W]");
  const int64_t B = x.size(0), C = channels_, H = x.size(2), W = x.size(3), L = H * W;
  at::Tensor tokens = group_norm(group_norm_, x).view({B, C, L}).transpose(1, 2);
  at::Tensor q = to_q_->forward(tokens).unsqueeze(1);  // [B, 1, L, C]
  at::Tensor k = to_k_->forward(tokens).unsqueeze(1);
  at::Tensor v = to_v_->forward(tokens).unsqueeze(1);

  // Query rows are independent: chunking them bounds the [rows, L] score matrix without changing
  // what each row computes.
  const int64_t row_bytes = B * L * static_cast<int64_t>(q.element_size());
  const int64_t rows = std::max<int64_t>(1, nn::kAttentionChunkBytes / std::max<int64_t>(row_bytes, 1));
  at::Tensor attended;
  if (rows >= L) {
    attended = nn::attention(q, k, v);
  } else {
    attended = at::empty_like(q);
    for (int64_t start = 0; start < L; start += rows) {
      const int64_t n = std::min(rows, L - start);
      attended.narrow(2, start, n).copy_(nn::attention(q.narrow(2, start, n), k, v));
    }
  }
  at::Tensor out = to_out_0_->forward(attended.squeeze(1));  // [B, L, C]
  // Back to [B, C, H, W] (a channels-last view of `out`, no copy); diffusers then divides by
  // rescale_output_factor = 1 (omitted: x / 1 is x).
  return out.transpose(1, 2).reshape({B, C, H, W}).add_(x);
}

}  // namespace fluxmpi::vae
