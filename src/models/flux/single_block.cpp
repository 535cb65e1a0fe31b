#include "models/flux/single_block.h"

#include "models/common/cpu_linear.h"
#include "models/common/tensor_utils.h"
#include "models/flux/double_block.h"
#include "models/flux/fused.h"

namespace fluxmpi::flux {

SingleBlockImpl::SingleBlockImpl(int64_t dim_, int64_t heads, int64_t head_dim) : dim(dim_), mlp_dim(4 * dim_) {
  norm = register_module("norm", AdaNorm(dim, 3));
  proj_mlp = register_module("proj_mlp", nn::Linear(dim, mlp_dim));
  proj_out = register_module("proj_out", nn::Linear(dim + mlp_dim, dim));
  attn = register_module("attn", FluxAttention(dim, heads, head_dim, /*joint=*/false));
}

void SingleBlockImpl::fuse() {
  fused_ = nn::fuse_linears({attn->to_q, attn->to_k, attn->to_v, proj_mlp});
}

at::Tensor SingleBlockImpl::forward(const at::Tensor& x, const at::Tensor& temb, const RopeTables& rope,
                                    KvCache* kv) const {
  // x: [B, N, D] with N = S + L, temb: [B, D]
  nn::check_shape(x, {temb.size(0), rope.cos.size(0), dim}, "single block x [B, S+L, D]");
  auto m = norm->chunks(temb, kv != nullptr ? &kv->modulation[0] : nullptr);  // shift, scale, gate
  at::Tensor h = modulate(x, m[0], m[1]);
  const int64_t inner = attn->heads * attn->head_dim;
  if (fused_.defined() && fused::applies(x)) {
    // The attention output and GELU(mlp) are written side by side into proj_out's input: no cat.
    at::Tensor all = nn::linear(h, fused_);
    at::Tensor both = at::empty({x.size(0), x.size(1), inner + mlp_dim}, x.options());
    attn->attend_into(all.narrow(-1, 0, inner), all.narrow(-1, inner, inner), all.narrow(-1, 2 * inner, inner), rope,
                      both.narrow(-1, 0, inner), kv);
    fused::gelu_tanh_into(all.narrow(-1, 3 * inner, mlp_dim), both.narrow(-1, inner, mlp_dim));
    return clip_fp16(gated_residual(x, m[2], proj_out->forward(both)));
  }
  at::Tensor q, k, v, mlp;
  if (fused_.defined()) {
    at::Tensor all = nn::linear(h, fused_);
    q = all.narrow(-1, 0, inner);
    k = all.narrow(-1, inner, inner);
    v = all.narrow(-1, 2 * inner, inner);
    mlp = all.narrow(-1, 3 * inner, mlp_dim);
  } else {
    q = attn->to_q->forward(h);
    k = attn->to_k->forward(h);
    v = attn->to_v->forward(h);
    mlp = proj_mlp->forward(h);
  }
  at::Tensor attn_out = attn->attend(q, k, v, rope, kv);
  at::Tensor y = proj_out->forward(at::cat({attn_out, nn::gelu_tanh(mlp)}, 2));
  return clip_fp16(gated_residual(x, m[2], y));
}

}  // namespace fluxmpi::flux
