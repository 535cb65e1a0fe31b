#include "models/common/attention.h"

#include <torch/version.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "models/common/tiled_attention.h"

namespace fluxmpi::nn {
namespace {

at::Tensor math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                          double scale, bool causal) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  if (scale != 1.0) scores.mul_(scale);
  if (bias.defined()) scores.add_(bias);
  if (causal) {
    int64_t lq = q.size(-2), lk = k.size(-2);
    at::Tensor mask = at::ones({lq, lk}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
    scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());
  }
  // libtorch 1.13's CPU bf16/fp16 gemm accumulates in the 16-bit type when the right operand is
  // laid out untransposed (relative error ~1e-2 at 160 keys, ~1e-1 at 4096); the same v stored
  // transposed takes the kernel that accumulates in fp32.
  at::Tensor v_layout = v;
  if (!v.is_cuda() && (v.scalar_type() == at::kBFloat16 || v.scalar_type() == at::kHalf))
    v_layout = v.transpose(-2, -1).contiguous().transpose(-2, -1);
  return at::matmul(at::softmax(scores, -1), v_layout);
}

#if TORCH_VERSION_MAJOR >= 2
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                          double scale, bool causal) {
  if (bias.defined() && causal) {
    // SDPA takes a mask or is_causal, not both: the causal mask joins the bias.
    const int64_t lq = q.size(-2), lk = k.size(-2);
    at::Tensor future = at::ones({lq, lk}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
    at::Tensor b = bias.expand({q.size(0), q.size(1), lq, lk}).masked_fill(future, -std::numeric_limits<float>::infinity());
    return at::scaled_dot_product_attention(q, k, v, b.to(q.scalar_type()), 0.0, false, scale);
  }
  std::optional<at::Tensor> mask;
  if (bias.defined()) mask = bias.scalar_type() == q.scalar_type() ? bias : bias.to(q.scalar_type());
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, causal && !bias.defined(), scale);
}
#endif

at::Tensor chunked_math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                                  double s, bool causal) {
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Lk = k.size(2);
  const int64_t per_head = Lq * Lk * static_cast<int64_t>(q.element_size());
  const int64_t heads_per_chunk = std::max<int64_t>(1, kAttentionChunkBytes / std::max<int64_t>(per_head, 1));
  if (B * H <= heads_per_chunk) return math_attention(q, k, v, bias, s, causal);
  // Split over batch x heads: view as [B*H, 1, L, Dh] chunks.
  at::Tensor q3 = q.reshape({B * H, 1, Lq, q.size(3)});
  at::Tensor k3 = k.reshape({B * H, 1, Lk, k.size(3)});
  at::Tensor v3 = v.reshape({B * H, 1, Lk, v.size(3)});
  at::Tensor b3;
  if (bias.defined()) b3 = bias.expand({B, H, Lq, Lk}).reshape({B * H, 1, Lq, Lk});
  at::Tensor out = at::empty({B * H, 1, Lq, v.size(3)}, q.options());
  for (int64_t start = 0; start < B * H; start += heads_per_chunk) {
    int64_t n = std::min(heads_per_chunk, B * H - start);
    at::Tensor bc = b3.defined() ? b3.narrow(0, start, n) : at::Tensor();
    out.narrow(0, start, n).copy_(math_attention(q3.narrow(0, start, n), k3.narrow(0, start, n), v3.narrow(0, start, n), bc, s, causal));
  }
  return out.reshape({B, H, Lq, v.size(3)});
}

}  // namespace

bool sdpa_available() { return TORCH_VERSION_MAJOR >= 2; }

AttentionPath default_attention_path(const at::Tensor& q) {
  if (q.device().is_cpu()) return tiled_attention_applies(q) ? AttentionPath::Tiled : AttentionPath::Math;
  return sdpa_available() ? AttentionPath::Sdpa : AttentionPath::Math;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                     std::optional<double> scale, bool causal) {
  return attention_via(AttentionPath::Auto, q, k, v, bias, scale, causal);
}

at::Tensor attention_via(AttentionPath path, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& bias, std::optional<double> scale, bool causal) {
  FLUX_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention expects [B, H, L, Dh] tensors");
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (path == AttentionPath::Auto) path = default_attention_path(q);
  if (path == AttentionPath::Sdpa) {
#if TORCH_VERSION_MAJOR >= 2
    return sdpa_attention(q, k, v, bias, s, causal);
#else
    throw InternalError(str_cat("attention: scaled_dot_product_attention needs libtorch >= 2.0, this is ", TORCH_VERSION));
#endif
  }
  if (path == AttentionPath::Tiled) {
    FLUX_CHECK(tiled_attention_applies(q), "attention: the tiled path takes CPU fp32 or bf16 tensors, not ", q.scalar_type(),
               " on ", q.device());
    // A GEMM operand needs unit-stride rows that do not overlap (not an expanded sequence).
    auto rows = [](const at::Tensor& t) {
      return t.stride(3) != 1 || (t.size(2) > 1 && t.stride(2) < t.size(3)) ? t.contiguous() : t;
    };
    // Keys already in the kernel's transposed layout (a heads-first KV cache) are read in place.
    const at::Tensor keys = keys_transposed(k) ? k : rows(k);
    at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    tiled_attention_into(rows(q), keys, rows(v), out, s, bias, causal);
    return out;
  }
  return chunked_math_attention(q, k, v, bias, s, causal);
}

}  // namespace fluxmpi::nn
