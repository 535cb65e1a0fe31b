#pragma once
/// The one attention function of fluxmpi, three ways: at::scaled_dot_product_attention (libtorch
/// >= 2.0: fused flash / memory-efficient kernels on GPU, a tiled kernel on the CPU); fluxmpi's
/// own tiled attention with an online softmax on the CPU in fp32 and bf16 (tiled_attention.h),
/// which never forms the score matrix; and plain softmax(q k^T * scale + bias) v (T5 everywhere,
/// fp16 on the CPU, GPUs without libtorch 2), computed in chunks of heads so the score matrix
/// stays small; chunking does not change any result bit (each head is an independent matmul).

#include <ATen/ATen.h>

#include <optional>

namespace fluxmpi::nn {

/// How attention() computes: `Sdpa` = at::scaled_dot_product_attention (libtorch >= 2.0 only),
/// `Math` = the chunked softmax(q k^T) v, with the scores in the input dtype and libtorch's softmax
/// (fp32 inside, one rounding), `Tiled` = tiled_attention_into() (CPU, fp32 and bf16 only).
/// `Auto`, what FLUX, CLIP and the VAE use: default_attention_path(). T5 takes Math everywhere:
/// its reference, transformers' T5Attention, is eager only.
enum class AttentionPath { Auto, Math, Sdpa, Tiled };

/// Whether this libtorch has at::scaled_dot_product_attention.
bool sdpa_available();

/// The path `Auto` takes for these inputs (measured by tools/bench/attention_bench;
/// docs/performance.md): on the CPU Tiled for fp32 and bf16 (faster than both the math path and
/// libtorch 2.6's SDPA, which in bf16 is several times slower than either), Math for fp16; on
/// other devices Sdpa where the libtorch has it, else Math.
AttentionPath default_attention_path(const at::Tensor& q);

/// q: [B, H, Lq, Dh], k, v: [B, H, Lk, Dh] -> [B, H, Lq, Dh].
/// `bias`: additive, broadcastable to [B, H, Lq, Lk] (undefined = none). `scale`: default
/// 1/sqrt(Dh). `causal`: mask keys after the query position.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias = {},
                     std::optional<double> scale = std::nullopt, bool causal = false);
/// The same through a chosen path (T5, tests and benchmarks); Sdpa on a libtorch without it throws.
at::Tensor attention_via(AttentionPath path, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& bias = {}, std::optional<double> scale = std::nullopt, bool causal = false);

/// Bytes the score matrix of one chunk may take before attention() splits the heads (math path).
inline constexpr int64_t kAttentionChunkBytes = 256ll << 20;

}  // namespace fluxmpi::nn
