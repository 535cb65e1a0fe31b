#include "models/flux2/single_block.h"

#include "models/common/tensor_utils.h"
#include "models/flux/double_block.h"
#include "models/flux2/double_block.h"
#include "models/flux2/modulation.h"

namespace fluxmpi::flux2 {

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(int64_t dim, int64_t heads_, int64_t head_dim_,
                                                     int64_t mlp_hidden_, double eps)
    : heads(heads_), head_dim(head_dim_), mlp_hidden(mlp_hidden_) {
  const int64_t inner = heads * head_dim;
  to_qkv_mlp_proj = register_module("to_qkv_mlp_proj", nn::Linear(dim, 3 * inner + 2 * mlp_hidden, /*bias=*/false));
  norm_q = register_module("norm_q", nn::RMSNorm(head_dim, eps));
  norm_k = register_module("norm_k", nn::RMSNorm(head_dim, eps));
  to_out = register_module("to_out", nn::Linear(inner + mlp_hidden, dim, /*bias=*/false));
}

at::Tensor ParallelSelfAttentionImpl::forward(const at::Tensor& x, const flux::RopeTables& rope,
                                              flux::KvCache* kv) const {
  // x: [B, N, D]
  const int64_t B = x.size(0), N = x.size(1), inner = heads * head_dim;
  at::Tensor all = to_qkv_mlp_proj->forward(x);
  const auto heads_of = [&](int64_t at) { return all.narrow(-1, at, inner).view({B, N, heads, head_dim}); };
  at::Tensor q = norm_q->forward(heads_of(0));
  at::Tensor k = norm_k->forward(heads_of(inner));
  at::Tensor attended = flux::rope_attention(q, k, heads_of(2 * inner), rope, kv);  // [B, N, inner]
  at::Tensor mlp = swiglu(all.narrow(-1, 3 * inner, 2 * mlp_hidden));
  return to_out->forward(at::cat({attended, mlp}, -1));
}

SingleBlockImpl::SingleBlockImpl(int64_t dim_, int64_t heads, int64_t head_dim, int64_t mlp_hidden, double eps_)
    : dim(dim_), eps(eps_) {
  attn = register_module("attn", ParallelSelfAttention(dim, heads, head_dim, mlp_hidden, eps));
}

at::Tensor SingleBlockImpl::forward(const at::Tensor& x, const at::Tensor& mod, const flux::RopeTables& rope,
                                    flux::KvCache* kv) const {
  // x: [B, N, D], mod: [B, 3D]
  const int64_t B = x.size(0);
  nn::check_shape(x, {B, rope.cos.size(0), dim}, "single block x [B, S+L, D]");
  nn::check_shape(mod, {B, 3 * dim}, "single block modulation [B, 3D]");
  const ModulationSet m = modulation_set(mod, dim, 0);
  at::Tensor y = attn->forward(modulate(x, m.shift, m.scale, eps), rope, kv);
  return flux::clip_fp16(gated_residual(x, m.gate, y));
}

}  // namespace fluxmpi::flux2
