#pragma once
/// Joint attention of FLUX.2's double-stream blocks: q/k/v projections of each stream (no
/// biases), per-head RMSNorm of q and k (learned, eps from the config; norm_added_* for text), the
/// joint sequence text first, then image, RoPE on interleaved pairs, softmax(q k^T / sqrt(Dh)) v,
/// and each stream's output projection (to_out.0 for the image, to_add_out for the text).
/// Semantics of diffusers Flux2Attention with Flux2AttnProcessor. The core after the norms is
/// FLUX.1's flux::rope_attention, so patch pipelining's KV caches work as they do for FLUX.1.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "models/common/layers.h"
#include "models/flux/attention.h"
#include "models/flux/rope.h"

namespace fluxmpi::flux2 {

class JointAttentionImpl : public torch::nn::Module {
 public:
  JointAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, double eps);
  /// txt: [B, S, D], img: [B, L, D] (both modulated) -> (txt_out, img_out), projected. With `kv`
  /// the tokens are a window of the joint sequence (flux::KvCache; `rope` holds its rows; S may be 0).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& txt, const at::Tensor& img, const flux::RopeTables& rope,
                                            flux::KvCache* kv = nullptr) const;

  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  nn::RMSNorm norm_q{nullptr}, norm_k{nullptr};
  nn::Linear add_q_proj{nullptr}, add_k_proj{nullptr}, add_v_proj{nullptr};
  nn::RMSNorm norm_added_q{nullptr}, norm_added_k{nullptr};
  torch::nn::ModuleList to_out{nullptr};  ///< [0] = output projection of the image stream (diffusers' [1] is a dropout)
  nn::Linear to_add_out{nullptr};
  int64_t heads, head_dim;

 private:
  nn::Linear out_proj_{nullptr};  ///< to_out[0], typed
};
TORCH_MODULE(JointAttention);

}  // namespace fluxmpi::flux2
