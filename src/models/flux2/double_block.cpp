#include "models/flux2/double_block.h"

#include "models/common/tensor_utils.h"
#include "models/flux/double_block.h"

namespace fluxmpi::flux2 {

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t inner) {
  linear_in = register_module("linear_in", nn::Linear(dim, 2 * inner, /*bias=*/false));
  linear_out = register_module("linear_out", nn::Linear(inner, dim, /*bias=*/false));
}

at::Tensor swiglu(const at::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::silu(halves[0]) * halves[1];
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) const { return linear_out->forward(swiglu(linear_in->forward(x))); }

DoubleBlockImpl::DoubleBlockImpl(int64_t dim_, int64_t heads, int64_t head_dim, int64_t mlp_hidden, double eps_)
    : dim(dim_), eps(eps_) {
  attn = register_module("attn", JointAttention(dim, heads, head_dim, eps));
  ff = register_module("ff", FeedForward(dim, mlp_hidden));
  ff_context = register_module("ff_context", FeedForward(dim, mlp_hidden));
}

std::pair<at::Tensor, at::Tensor> DoubleBlockImpl::forward(const at::Tensor& txt, const at::Tensor& img,
                                                           const at::Tensor& img_mod, const at::Tensor& txt_mod,
                                                           const flux::RopeTables& rope, flux::KvCache* kv) const {
  // txt: [B, S, D], img: [B, L, D], img_mod / txt_mod: [B, 6D]
  const int64_t B = img.size(0);
  nn::check_shape(img, {B, -1, dim}, "double block img [B, L, D]");
  nn::check_shape(txt, {B, -1, dim}, "double block txt [B, S, D]");
  nn::check_shape(img_mod, {B, 6 * dim}, "double block image modulation [B, 6D]");
  nn::check_shape(txt_mod, {B, 6 * dim}, "double block text modulation [B, 6D]");
  const ModulationSet m_attn = modulation_set(img_mod, dim, 0), m_mlp = modulation_set(img_mod, dim, 1);
  const ModulationSet c_attn = modulation_set(txt_mod, dim, 0), c_mlp = modulation_set(txt_mod, dim, 1);
  auto [txt_attn, img_attn] = attn->forward(modulate(txt, c_attn.shift, c_attn.scale, eps),
                                            modulate(img, m_attn.shift, m_attn.scale, eps), rope, kv);

  at::Tensor x = gated_residual(img, m_attn.gate, img_attn);
  x = gated_residual(x, m_mlp.gate, ff->forward(modulate(x, m_mlp.shift, m_mlp.scale, eps)));

  at::Tensor t = gated_residual(txt, c_attn.gate, txt_attn);
  t = gated_residual(t, c_mlp.gate, ff_context->forward(modulate(t, c_mlp.shift, c_mlp.scale, eps)));
  return {flux::clip_fp16(t), x};
}

}  // namespace fluxmpi::flux2
