#pragma once
/// The VAE's group norm on channels-last activations (the decoder runs channels-last).

#include <ATen/ATen.h>

#include "models/common/layers.h"

namespace fluxmpi::vae {

/// norm(x). Where switched on (set_group_norm_nhwc), CPU fp32 and bf16 channels-last input is
/// normalised by group_norm_nhwc below, which keeps the memory format (libtorch 1.13's group norm
/// returns NCHW, and each convolution would then copy its input back) and is right in bf16 (libtorch 1.13's own CPU kernel is wrong for bf16
/// channels-last input: max error 3.4-10 against 0.02-0.1 for the same input in NCHW).
at::Tensor group_norm(const nn::GroupNorm& norm, const at::Tensor& x);

/// silu(norm(x)), the pair that opens each of the VAE's residual blocks: one pass over the output
/// where group_norm_nhwc applies, else group_norm then SiLU in place.
at::Tensor group_norm_silu(const nn::GroupNorm& norm, const at::Tensor& x);

/// Whether group_norm_nhwc takes x: on, CPU fp32 or bf16, 4-D, channels-last and not also
/// NCHW-contiguous.
bool group_norm_nhwc_applies(const at::Tensor& x);
/// Process-wide switch of group_norm_nhwc (default off: libtorch's group norm, as the fixtures were
/// checked with in both CI lanes), for benchmarks (fluxmpi-bench-vae --conv winograd) and tests.
void set_group_norm_nhwc(bool on);

/// torch.nn.GroupNorm of channels-last x [B, C, H, W] (fp32 or bf16) into a channels-last result of
/// its dtype, optionally followed by SiLU: each group's mean and biased variance summed in float64
/// over pixel chunks of a fixed size, combined in order (so the result does not depend on the
/// thread count), then y = x * a + d per channel in fp32 with a = rstd * weight, d = bias - mean * a
/// (libtorch's form), rounded to the dtype; SiLU of that as y * sigmoid(y) with sigmoid from
/// e^(-|y|) (cpu::exp_nonpositive, within 6e-9 relative), rounded again.
at::Tensor group_norm_nhwc(const at::Tensor& x, int64_t groups, const at::Tensor& weight, const at::Tensor& bias,
                           double eps, bool silu);

}  // namespace fluxmpi::vae
