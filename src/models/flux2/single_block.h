#pragma once
/// Single-stream ("parallel") block of FLUX.2 on the joint sequence [text; image]: one projection
/// gives q | k | v | the SwiGLU input, one projection maps cat(attention, SwiGLU) back, gated
/// residual with the global single-stream modulation. Semantics of diffusers
/// Flux2SingleTransformerBlock and Flux2ParallelSelfAttention.

#include <torch/nn/module.h>

#include "models/common/layers.h"
#include "models/flux/attention.h"
#include "models/flux/rope.h"

namespace fluxmpi::flux2 {

/// The block's `attn`: to_qkv_mlp_proj (D -> 3 * inner + 2 * mlp_hidden), norm_q, norm_k,
/// to_out (inner + mlp_hidden -> D), no biases.
class ParallelSelfAttentionImpl : public torch::nn::Module {
 public:
  ParallelSelfAttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden, double eps);
  /// x: [B, N, D] (modulated) -> [B, N, D]. With `kv` x is a window of the sequence.
  at::Tensor forward(const at::Tensor& x, const flux::RopeTables& rope, flux::KvCache* kv = nullptr) const;

  nn::Linear to_qkv_mlp_proj{nullptr}, to_out{nullptr};
  nn::RMSNorm norm_q{nullptr}, norm_k{nullptr};
  int64_t heads, head_dim, mlp_hidden;
};
TORCH_MODULE(ParallelSelfAttention);

class SingleBlockImpl : public torch::nn::Module {
 public:
  SingleBlockImpl(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden, double eps);
  /// x: [B, N, D] with N = S + L, mod: [B, 3D] (shift, scale, gate) -> [B, N, D].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mod, const flux::RopeTables& rope,
                     flux::KvCache* kv = nullptr) const;

  ParallelSelfAttention attn{nullptr};
  int64_t dim;
  double eps;
};
TORCH_MODULE(SingleBlock);

}  // namespace fluxmpi::flux2
