#pragma once
/// Single-stream block on the joint sequence [text; image]: attention and an MLP side by side on
/// the same modulated input, projected together, gated residual. Semantics of diffusers
/// FluxSingleTransformerBlock.

#include <torch/nn/module.h>

#include "models/flux/attention.h"
#include "models/flux/modulation.h"

namespace fluxmpi::flux {

class SingleBlockImpl : public torch::nn::Module {
 public:
  SingleBlockImpl(int64_t dim, int64_t heads, int64_t head_dim);
  /// x: [B, S+L, D], temb: [B, D] -> [B, S+L, D]. With `kv` (patch pipelining) x is a window of
  /// the sequence.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb, const RopeTables& rope, KvCache* kv = nullptr) const;
  /// Fuses to_q | to_k | to_v | proj_mlp (all read the modulated input) into one matmul.
  void fuse();

  AdaNorm norm{nullptr};
  nn::Linear proj_mlp{nullptr}, proj_out{nullptr};
  FluxAttention attn{nullptr};
  int64_t dim, mlp_dim;

 private:
  nn::FusedLinear fused_;  ///< to_q|to_k|to_v|proj_mlp
};
TORCH_MODULE(SingleBlock);

}  // namespace fluxmpi::flux
