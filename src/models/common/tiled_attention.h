#pragma once
/// Attention on the CPU in tiles with an online softmax (the flash-attention scheme): for each
/// block of kTileQueries queries of one (batch, head), the keys are visited kTileKeys at a time;
/// a tile's scores q k^T (one GEMM) are turned into exponentials against the running row maximum,
/// the output rows accumulated so far are rescaled when the maximum grows, and the tile's
/// exponentials times its values are added (a second GEMM). At the end each row is divided by its
/// sum of exponentials. The [B, H, Lq, Lk] score matrix is never formed: a thread holds one
/// [kTileQueries, kTileKeys] tile, in cache.
///
/// Arithmetic: the scores are kept in base 2 (the GEMM's scale times log2 e), so that the
/// exponentials are powers of 2 (cpu::exp2_nonpositive, within 2 float ulps). fp32 inputs in
/// fp32 throughout. bf16 inputs: the scores, exponentials, sums and the output rows in fp32 (the
/// GEMMs take bf16 operands and accumulate in fp32); the exponentials are rounded to bf16 to
/// enter the second GEMM, and the output once at the end.
///
/// Determinism: every (batch, head, query block) is one task with its own buffers, its sums in a
/// fixed order, and the GEMMs run on the task's thread; so the result does not depend on the
/// thread count or on which thread runs a task, and a query row's result depends on the row's
/// position in its block of kTileQueries, never on other rows' values. Equal shapes give equal
/// bits.

#include <ATen/ATen.h>

namespace fluxmpi::nn {

/// Queries and keys per tile.
inline constexpr int64_t kTileQueries = 64;
inline constexpr int64_t kTileKeys = 512;

/// Whether tiled_attention_into() handles tensors like `q`: CPU, fp32 or bf16.
bool tiled_attention_applies(const at::Tensor& q);

/// Whether keys k [B, H, Lk, Dh] are a view of contiguous [B, H, Dh, Lk] ones: the tiled kernel's
/// own layout of the keys (flux::KvCache's heads-first layout).
bool keys_transposed(const at::Tensor& k);

/// out = softmax(q k^T * scale + bias) v, with `causal` masking key j > query i (the top-left
/// alignment of nn::attention). q: [B, H, Lq, Dh], k: [B, H, Lk, Dh], v: [B, H, Lk, Dv],
/// out: [B, H, Lq, Dv], all of one dtype (fp32 or bf16) with any strides and a unit last stride
/// (e.g. [B, L, H, Dh] buffers seen through transpose(1, 2)), or, for k, a transposed view of
/// contiguous [B, H, Dh, Lk] keys (keys_transposed), which the kernel reads in place instead of
/// copying them into that layout; `bias` (any float dtype) must
/// broadcast to [B, H, Lq, Lk]. Lk > 0. A row whose every score is -inf comes out NaN, as
/// softmax gives it.
void tiled_attention_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                          double scale, const at::Tensor& bias = {}, bool causal = false);

}  // namespace fluxmpi::nn
