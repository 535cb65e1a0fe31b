#pragma once
/// Double-stream block: text and image tokens keep separate weights but attend jointly.
/// Semantics of diffusers FluxTransformerBlock.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "models/flux/attention.h"
#include "models/flux/modulation.h"

namespace fluxmpi::flux {

/// ff.net.0.proj -> GELU(tanh) -> ff.net.2 (diffusers FeedForward with "gelu-approximate").
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, int64_t hidden);
  at::Tensor forward(const at::Tensor& x) const;
  torch::nn::ModuleList net{nullptr};

 private:
  nn::Linear proj_{nullptr}, out_{nullptr};
};
TORCH_MODULE(FeedForward);

class DoubleBlockImpl : public torch::nn::Module {
 public:
  DoubleBlockImpl(int64_t dim, int64_t heads, int64_t head_dim);
  /// txt: [B, S, D], img: [B, L, D], temb: [B, D] -> (txt, img) of the same shapes. With `kv`
  /// (patch pipelining) the tokens are a window of the sequence; S may be 0.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& txt, const at::Tensor& img, const at::Tensor& temb,
                                            const RopeTables& rope, KvCache* kv = nullptr) const;
  void fuse() { attn->fuse(); }

  AdaNorm norm1{nullptr}, norm1_context{nullptr};
  FluxAttention attn{nullptr};
  FeedForward ff{nullptr}, ff_context{nullptr};
};
TORCH_MODULE(DoubleBlock);

/// fp16 activations are clipped to the finite range after each block, as diffusers does.
at::Tensor clip_fp16(const at::Tensor& x);

}  // namespace fluxmpi::flux
