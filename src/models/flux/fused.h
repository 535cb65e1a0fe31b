#pragma once
/// CPU kernels for the memory-bound steps of the FLUX blocks that libtorch 1.13 runs as chains of
/// small operators, each a full pass over the activations with its own allocation. Same
/// arithmetic as the operator-by-operator formulation (diffusers'): in fp32 the same products and
/// sums, in bf16 the same rounding to bf16 after each step that rounds there; only the order of
/// the sums of RMSNorm's mean differs (within the fp32 parity tolerance). Used on the CPU for fp32
/// and bf16 tensors (applies()); the model falls back to the operator formulation elsewhere.

#include <ATen/ATen.h>

#include "models/flux/rope.h"

namespace fluxmpi::flux::fused {

/// Whether the kernels handle tensors like `t`: CPU, fp32 or bf16.
bool applies(const at::Tensor& t);

/// q or k of one stream into the attention input: for x [B, N, H, Dh] (any strides with a unit
/// last stride, e.g. a slice of the fused q|k|v projection), writes
///   apply_rope(RMSNorm(x) * weight)          (RMSNormImpl::forward and apply_rope in one pass)
/// with the rope tables' rows rope_row0 .. rope_row0 + N into out [B, H, N, Dh] (x's dtype, any
/// strides with a unit last stride: rows of a [B, H, Ntot, Dh] buffer, or of a [B, Ntot, H, Dh]
/// key cache seen through transpose(1, 2)).
void rms_norm_rope_into(const at::Tensor& x, const at::Tensor& weight, double eps, const RopeTables& rope,
                        int64_t rope_row0, const at::Tensor& out);

/// GELU with the tanh approximation (at::gelu(x, "tanh")) of a CPU fp32 or bf16 x [B, N, C] into
/// out of the same sizes and dtype (any row strides, unit last stride: out may be a column slice),
/// computed in float as x sigmoid(2u) and rounded once, as libtorch's kernel rounds (libtorch
/// 1.13's runs bf16 at half its fp32 speed, and its fp32 one at about a fifth of this loop's).
void gelu_tanh_into(const at::Tensor& x, const at::Tensor& out);

/// LayerNorm(x) * (1 + scale) + shift (no affine, `eps`) for a contiguous CPU fp32 or bf16
/// x [B, L, D] and shift, scale [B, D] of its dtype (unit last stride): modulate()'s operators
/// in one pass, rounding to the dtype where they do (1 + scale, the normed x, the result); mean
/// and variance in float.
at::Tensor layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);

}  // namespace fluxmpi::flux::fused
