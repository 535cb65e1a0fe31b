#include "models/flux2/attention.h"

#include "models/common/tensor_utils.h"

namespace fluxmpi::flux2 {

JointAttentionImpl::JointAttentionImpl(int64_t dim, int64_t heads_, int64_t head_dim_, double eps)
    : heads(heads_), head_dim(head_dim_) {
  const int64_t inner = heads * head_dim;
  to_q = register_module("to_q", nn::Linear(dim, inner, /*bias=*/false));
  to_k = register_module("to_k", nn::Linear(dim, inner, /*bias=*/false));
  to_v = register_module("to_v", nn::Linear(dim, inner, /*bias=*/false));
  norm_q = register_module("norm_q", nn::RMSNorm(head_dim, eps));
  norm_k = register_module("norm_k", nn::RMSNorm(head_dim, eps));
  add_q_proj = register_module("add_q_proj", nn::Linear(dim, inner, /*bias=*/false));
  add_k_proj = register_module("add_k_proj", nn::Linear(dim, inner, /*bias=*/false));
  add_v_proj = register_module("add_v_proj", nn::Linear(dim, inner, /*bias=*/false));
  norm_added_q = register_module("norm_added_q", nn::RMSNorm(head_dim, eps));
  norm_added_k = register_module("norm_added_k", nn::RMSNorm(head_dim, eps));
  out_proj_ = nn::Linear(inner, dim, /*bias=*/false);
  to_out = register_module("to_out", torch::nn::ModuleList(out_proj_));
  to_add_out = register_module("to_add_out", nn::Linear(inner, dim, /*bias=*/false));
}

std::pair<at::Tensor, at::Tensor> JointAttentionImpl::forward(const at::Tensor& txt, const at::Tensor& img,
                                                              const flux::RopeTables& rope, flux::KvCache* kv) const {
  // txt: [B, S, D], img: [B, L, D]
  const int64_t B = img.size(0), S = txt.size(1), L = img.size(1);
  nn::check_shape(txt, {B, S, img.size(2)}, "joint attention txt [B, S, D]");
  const auto heads_of = [&](const at::Tensor& x) { return x.view({B, x.size(1), heads, head_dim}); };
  at::Tensor q = at::cat({norm_added_q->forward(heads_of(add_q_proj->forward(txt))),
                          norm_q->forward(heads_of(to_q->forward(img)))}, 1);
  at::Tensor k = at::cat({norm_added_k->forward(heads_of(add_k_proj->forward(txt))),
                          norm_k->forward(heads_of(to_k->forward(img)))}, 1);
  at::Tensor v = at::cat({heads_of(add_v_proj->forward(txt)), heads_of(to_v->forward(img))}, 1);
  at::Tensor out = flux::rope_attention(q, k, v, rope, kv);  // [B, S+L, H*Dh]
  return {to_add_out->forward(out.narrow(1, 0, S)), out_proj_->forward(out.narrow(1, S, L))};
}

}  // namespace fluxmpi::flux2
