#pragma once
/// Double-stream block of FLUX.2: text and image tokens keep separate weights but attend jointly;
/// the (shift, scale, gate) vectors come from the global modulation (flux2/modulation.h), not
/// from the block. Semantics of diffusers Flux2TransformerBlock.

#include <torch/nn/module.h>

#include "models/flux2/attention.h"
#include "models/flux2/modulation.h"

namespace fluxmpi::flux2 {

/// linear_in (D -> 2 * inner) -> SwiGLU (silu(first half) * second half) -> linear_out, no biases
/// (diffusers Flux2FeedForward).
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, int64_t inner);
  at::Tensor forward(const at::Tensor& x) const;
  nn::Linear linear_in{nullptr}, linear_out{nullptr};
};
TORCH_MODULE(FeedForward);

/// silu(x[..., :n]) * x[..., n:] for x [..., 2n] (diffusers Flux2SwiGLU).
at::Tensor swiglu(const at::Tensor& x);

class DoubleBlockImpl : public torch::nn::Module {
 public:
  DoubleBlockImpl(int64_t dim, int64_t heads, int64_t head_dim, int64_t mlp_hidden, double eps);
  /// txt: [B, S, D], img: [B, L, D]; img_mod / txt_mod: [B, 6D] (attention set, then MLP set) ->
  /// (txt, img) of the same shapes. With `kv` (patch pipelining) the tokens are a window of the
  /// sequence; S may be 0.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& txt, const at::Tensor& img, const at::Tensor& img_mod,
                                            const at::Tensor& txt_mod, const flux::RopeTables& rope,
                                            flux::KvCache* kv = nullptr) const;

  JointAttention attn{nullptr};
  FeedForward ff{nullptr}, ff_context{nullptr};
  int64_t dim;
  double eps;
};
TORCH_MODULE(DoubleBlock);

}  // namespace fluxmpi::flux2
