#include "models/flux/double_block.h"

#include "models/flux/fused.h"

#include <torch/nn/modules/linear.h>

#include "models/common/tensor_utils.h"

namespace fluxmpi::flux {

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t hidden) {
  // Index 1 is diffusers' (parameterless) dropout; it keeps the output layer at index 2.
  auto gelu = std::make_shared<torch::nn::Module>();
  proj_ = gelu->register_module("proj", nn::Linear(dim, hidden));
  out_ = nn::Linear(hidden, dim);
  net = register_module("net", torch::nn::ModuleList());
  net->push_back(gelu);
  net->push_back(torch::nn::Identity());
  net->push_back(out_);
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) const {
  at::Tensor h = proj_->forward(x);
  if (fused::applies(h) && h.dim() == 3 && h.stride(2) == 1) {
    at::Tensor g = at::empty_like(h);
    fused::gelu_tanh_into(h, g);
    return out_->forward(g);
  }
  return out_->forward(nn::gelu_tanh(h));
}

at::Tensor clip_fp16(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? x.clamp(-65504, 65504) : x;
}

DoubleBlockImpl::DoubleBlockImpl(int64_t dim, int64_t heads, int64_t head_dim) {
  norm1 = register_module("norm1", AdaNorm(dim, 6));
  norm1_context = register_module("norm1_context", AdaNorm(dim, 6));
  attn = register_module("attn", FluxAttention(dim, heads, head_dim, /*joint=*/true));
  ff = register_module("ff", FeedForward(dim, 4 * dim));
  ff_context = register_module("ff_context", FeedForward(dim, 4 * dim));
}

std::pair<at::Tensor, at::Tensor> DoubleBlockImpl::forward(const at::Tensor& txt, const at::Tensor& img,
                                                           const at::Tensor& temb, const RopeTables& rope,
                                                           KvCache* kv) const {
  // txt: [B, S, D], img: [B, L, D], temb: [B, D]
  nn::check_shape(img, {txt.size(0), -1, txt.size(2)}, "double block img [B, L, D]");
  // shift, scale, gate (attention), shift, scale, gate (mlp)
  auto m = norm1->chunks(temb, kv != nullptr ? &kv->modulation[0] : nullptr);
  auto c = norm1_context->chunks(temb, kv != nullptr ? &kv->modulation[1] : nullptr);
  auto [txt_attn, img_attn] = attn->forward_joint(modulate(txt, c[0], c[1]), modulate(img, m[0], m[1]), rope, kv);

  at::Tensor x = gated_residual(img, m[2], img_attn);
  x = gated_residual(x, m[5], ff->forward(modulate(x, m[3], m[4])));

  at::Tensor t = gated_residual(txt, c[2], txt_attn);
  t = gated_residual(t, c[5], ff_context->forward(modulate(t, c[3], c[4])));
  return {clip_fp16(t), x};
}

}  // namespace fluxmpi::flux
