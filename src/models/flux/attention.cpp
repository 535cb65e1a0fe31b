#include "models/flux/attention.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "models/common/attention.h"
#include "models/common/cpu_linear.h"
#include "models/common/tensor_utils.h"
#include "models/common/tiled_attention.h"
#include "models/flux/fused.h"

namespace fluxmpi::flux {

FluxAttentionImpl::FluxAttentionImpl(int64_t dim, int64_t heads_, int64_t head_dim_, bool joint)
    : heads(heads_), head_dim(head_dim_) {
  const int64_t inner = heads * head_dim;
  to_q = register_module("to_q", nn::Linear(dim, inner));
  to_k = register_module("to_k", nn::Linear(dim, inner));
  to_v = register_module("to_v", nn::Linear(dim, inner));
  norm_q = register_module("norm_q", nn::RMSNorm(head_dim, 1e-6));
  norm_k = register_module("norm_k", nn::RMSNorm(head_dim, 1e-6));
  if (joint) {
    add_q_proj = register_module("add_q_proj", nn::Linear(dim, inner));
    add_k_proj = register_module("add_k_proj", nn::Linear(dim, inner));
    add_v_proj = register_module("add_v_proj", nn::Linear(dim, inner));
    norm_added_q = register_module("norm_added_q", nn::RMSNorm(head_dim, 1e-6));
    norm_added_k = register_module("norm_added_k", nn::RMSNorm(head_dim, 1e-6));
    out_proj_ = nn::Linear(inner, dim);
    to_out = register_module("to_out", torch::nn::ModuleList(out_proj_));
    to_add_out = register_module("to_add_out", nn::Linear(inner, dim));
  }
}


void FluxAttentionImpl::fuse() {
  fused_ = nn::fuse_linears({to_q, to_k, to_v});
  if (add_q_proj) fused_add_ = nn::fuse_linears({add_q_proj, add_k_proj, add_v_proj});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> FluxAttentionImpl::project(const at::Tensor& x, bool text) const {
  const int64_t B = x.size(0), N = x.size(1), inner = heads * head_dim;
  at::Tensor q, k, v;
  const nn::FusedLinear& fused = text ? fused_add_ : fused_;
  if (fused.defined()) {
    at::Tensor qkv = nn::linear(x, fused);
    q = qkv.narrow(-1, 0, inner);
    k = qkv.narrow(-1, inner, inner);
    v = qkv.narrow(-1, 2 * inner, inner);
  } else {
    q = (text ? add_q_proj : to_q)->forward(x);
    k = (text ? add_k_proj : to_k)->forward(x);
    v = (text ? add_v_proj : to_v)->forward(x);
  }
  q = (text ? norm_added_q : norm_q)->forward(q.view({B, N, heads, head_dim}));
  k = (text ? norm_added_k : norm_k)->forward(k.view({B, N, heads, head_dim}));
  return {q, k, v.view({B, N, heads, head_dim})};
}

KvCache make_kv_cache(int64_t batch, int64_t rows, int64_t heads, int64_t head_dim, const at::TensorOptions& options) {
  KvCache c;
  c.heads_first = nn::default_attention_path(at::empty({0}, options)) == nn::AttentionPath::Tiled;
  if (c.heads_first) {
    c.k = at::empty({batch, heads, head_dim, rows}, options);
    c.v = at::empty({batch, heads, rows, head_dim}, options);
  } else {
    c.k = at::empty({batch, rows, heads, head_dim}, options);
    c.v = at::empty_like(c.k);
  }
  return c;
}

namespace {

// A call of N tokens fits the cache: its rows [offset, offset + N - tail) before the sequence's
// last `tail` rows; the cache's tensors are [B, H, N, Dh] in one of its layouts.
void check_window(const KvCache& kv, int64_t N) {
  const int64_t Ntot = kv.rows();
  FLUX_CHECK(kv.tail >= 0 && kv.tail <= N && kv.offset >= 0 && kv.offset + (N - kv.tail) <= Ntot - kv.tail,
             "KV cache window [", kv.offset, ", ", kv.offset + N - kv.tail, ") + the last ", kv.tail, " rows outside its ",
             Ntot, " rows");
  const at::Tensor keys = kv.keys(), values = kv.values();
  FLUX_CHECK(keys.dim() == 4 && values.sizes() == keys.sizes() && kv.k.is_contiguous() && kv.v.is_contiguous(),
             "KV cache: contiguous k and v holding [B, H, N, Dh] (", kv.heads_first ? "heads first" : "sequence first",
             "), got k ", nn::shape_string(kv.k.sizes()), ", v ", nn::shape_string(kv.v.sizes()));
}

}  // namespace

at::Tensor rope_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RopeTables& rope,
                          KvCache* kv) {
  // q, k, v: [B, N, H, Dh]
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), Dh = q.size(3);
  at::Tensor qr = apply_rope(q, rope).transpose(1, 2);
  at::Tensor keys = apply_rope(k, rope).transpose(1, 2), values = v.transpose(1, 2);  // [B, H, N, Dh]
  if (kv != nullptr) {
    check_window(*kv, N);
    // This call's own rows first: the window attends to its fresh keys, never to stale ones.
    const int64_t head = N - kv->tail, Ntot = kv->rows();
    const at::Tensor cached_keys = kv->keys(), cached_values = kv->values();
    cached_keys.narrow(2, kv->offset, head).copy_(keys.narrow(2, 0, head));
    cached_values.narrow(2, kv->offset, head).copy_(values.narrow(2, 0, head));
    if (kv->tail > 0) {
      cached_keys.narrow(2, Ntot - kv->tail, kv->tail).copy_(keys.narrow(2, head, kv->tail));
      cached_values.narrow(2, Ntot - kv->tail, kv->tail).copy_(values.narrow(2, head, kv->tail));
    }
    // A window attends to the whole sequence; the whole sequence (an exact step filling the
    // cache) attends to its own tensors, exactly as without a cache.
    if (N < Ntot) {
      keys = cached_keys;
      values = cached_values;
    }
  }
  at::Tensor out = nn::attention(qr, keys, values);  // [B, H, N, Dh]
  return out.transpose(1, 2).reshape({B, N, H * Dh}).to(q.scalar_type());
}

namespace {

// The attention of the fused CPU path. q: this call's N tokens, [B, H, N, Dh]. keys, values: the
// keys and values of the whole sequence as [B, H, Ntot, Dh] views: the KV cache's tensors when
// there is one (this call's rows written at its offset, the other rows as earlier calls left
// them), else buffers of this call's own (Ntot = N) in the tiled kernel's layout (keys
// transposed, as a heads-first cache). The same numbers whatever the layout, so a whole-sequence
// call gives the same bits with and without a cache.
struct JointQkv {
  at::Tensor q, keys, values;
  int64_t offset = 0;
  int64_t head = 0;      // the call's rows before its tail (KvCache::tail)
  int64_t tail_row = 0;  // where the tail goes in the sequence
  JointQkv(int64_t B, int64_t H, int64_t N, int64_t Dh, const at::TensorOptions& o, KvCache* kv)
      : q(at::empty({B, H, N, Dh}, o)), head(N), tail_row(N) {
    if (kv == nullptr) {
      keys = at::empty({B, H, Dh, N}, o).transpose(2, 3);
      values = at::empty({B, H, N, Dh}, o);
      return;
    }
    check_window(*kv, N);
    keys = kv->keys();
    values = kv->values();
    nn::check_shape(keys, {B, H, -1, Dh}, "KV cache keys [B, H, Ntot, Dh]");
    FLUX_CHECK(kv->k.scalar_type() == q.scalar_type() && kv->v.scalar_type() == q.scalar_type(),
               "KV cache: k and v of the run dtype");
    offset = kv->offset;
    head = N - kv->tail;
    tail_row = kv->rows() - kv->tail;
  }
  // This call's rows row0 .. row0 + n of one stream: qs, ks, vs [B, n, H, Dh] (slices of a
  // projection), normalised with nq / nk, rotated with the rope tables' rows row0 ...; keys and
  // values land in their sequence rows (the call's rows from `head` on in the cache's last rows).
  void add(const at::Tensor& qs, const at::Tensor& ks, const at::Tensor& vs, const nn::RMSNorm& nq,
           const nn::RMSNorm& nk, const RopeTables& rope, int64_t row0) {
    const int64_t n = qs.size(1);
    fused::rms_norm_rope_into(qs, nq->weight, nq->eps, rope, row0, q.narrow(2, row0, n));
    const int64_t split = std::clamp(head - row0, int64_t{0}, n);
    for (auto [first, count, seq] : {std::tuple<int64_t, int64_t, int64_t>{0, split, offset + row0},
                                     {split, n - split, tail_row + row0 + split - head}}) {
      if (count == 0) continue;
      const at::Tensor rows = keys.narrow(2, seq, count);
      if (nn::keys_transposed(keys)) {
        // Keys stored [B, H, Dh, Ntot]; the kernel writes rows of Dh: into a buffer of this call's
        // rows, then transposed.
        at::Tensor rotated = at::empty({q.size(0), q.size(1), count, q.size(3)}, q.options());
        fused::rms_norm_rope_into(ks.narrow(1, first, count), nk->weight, nk->eps, rope, row0 + first, rotated);
        rows.copy_(rotated);
      } else {
        fused::rms_norm_rope_into(ks.narrow(1, first, count), nk->weight, nk->eps, rope, row0 + first, rows);
      }
      values.narrow(2, seq, count).copy_(vs.narrow(1, first, count).transpose(1, 2));
    }
  }
  // The attention of this call's queries over every row of keys, values into out [B, N, H*Dh]
  // (any row stride, unit last stride).
  void attend_into(const at::Tensor& out) const {
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2), Dh = q.size(3);
    nn::tiled_attention_into(q, keys, values, out.view({B, N, H, Dh}).transpose(1, 2),
                             1.0 / std::sqrt(static_cast<double>(Dh)));
  }
};

}  // namespace

bool FluxAttentionImpl::fused_path(const at::Tensor& x) const {
  return fused::applies(x) && nn::tiled_attention_applies(x);
}

std::pair<at::Tensor, at::Tensor> FluxAttentionImpl::forward_joint(const at::Tensor& txt, const at::Tensor& img,
                                                                   const RopeTables& rope, KvCache* kv) const {
  // txt: [B, S, D], img: [B, L, D]
  FLUX_CHECK(add_q_proj, "forward_joint on a single-stream attention");
  const int64_t B = txt.size(0), S = txt.size(1), L = img.size(1), inner = heads * head_dim;
  if (fused_.defined() && fused_add_.defined() && fused_path(img)) {
    // One pass per tensor from the projections to the attention input, no cat; the attention
    // output lands in [B, S+L, H*Dh] directly.
    JointQkv j(B, heads, S + L, head_dim, img.options(), kv);
    const auto add = [&](const at::Tensor& qkv, const nn::RMSNorm& nq, const nn::RMSNorm& nk, int64_t row0) {
      const int64_t n = qkv.size(1);
      const auto part = [&](int64_t i) { return qkv.narrow(-1, i * inner, inner).view({B, n, heads, head_dim}); };
      j.add(part(0), part(1), part(2), nq, nk, rope, row0);
    };
    add(nn::linear(txt, fused_add_), norm_added_q, norm_added_k, 0);
    add(nn::linear(img, fused_), norm_q, norm_k, S);
    at::Tensor out = at::empty({B, S + L, inner}, img.options());
    j.attend_into(out);
    return {to_add_out->forward(out.narrow(1, 0, S)), out_proj_->forward(out.narrow(1, S, L))};
  }
  auto [iq, ik, iv] = project(img, /*text=*/false);
  auto [tq, tk, tv] = project(txt, /*text=*/true);
  at::Tensor out = rope_attention(at::cat({tq, iq}, 1), at::cat({tk, ik}, 1), at::cat({tv, iv}, 1), rope, kv);
  at::Tensor txt_out = to_add_out->forward(out.narrow(1, 0, S));
  at::Tensor img_out = out_proj_->forward(out.narrow(1, S, L));
  return {txt_out, img_out};
}

at::Tensor FluxAttentionImpl::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const RopeTables& rope, KvCache* kv) const {
  // q, k, v: [B, N, D] projections of the joint stream
  const int64_t B = q.size(0), N = q.size(1);
  if (fused_path(q)) {
    at::Tensor out = at::empty({B, N, heads * head_dim}, q.options());
    attend_into(q, k, v, rope, out, kv);
    return out;
  }
  return attend_reference(q, k, v, rope, kv);
}

at::Tensor FluxAttentionImpl::attend_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const RopeTables& rope, KvCache* kv) const {
  const int64_t B = q.size(0), N = q.size(1);
  at::Tensor qh = norm_q->forward(q.view({B, N, heads, head_dim}));
  at::Tensor kh = norm_k->forward(k.view({B, N, heads, head_dim}));
  return rope_attention(qh, kh, v.view({B, N, heads, head_dim}), rope, kv);
}

void FluxAttentionImpl::attend_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RopeTables& rope,
                                    at::Tensor out, KvCache* kv) const {
  const int64_t B = q.size(0), N = q.size(1), inner = heads * head_dim;
  nn::check_shape(out, {B, N, inner}, "attend_into out [B, N, H*Dh]");
  if (!fused_path(q)) {
    out.copy_(attend_reference(q, k, v, rope, kv));
    return;
  }
  JointQkv j(B, heads, N, head_dim, q.options(), kv);
  const auto view = [&](const at::Tensor& t) { return t.view({B, N, heads, head_dim}); };
  j.add(view(q), view(k), view(v), norm_q, norm_k, rope, 0);
  j.attend_into(out);
}

}  // namespace fluxmpi::flux
