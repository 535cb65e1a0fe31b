#pragma once
/// The VAE's group norm on channels-last activations (the decoder runs channels-last).

#include <ATen/ATen.h>

#include "models/common/layers.h"

namespace fluxmpi::vae {

/// norm(x). libtorch 1.13's CPU group norm is wrong for bf16 input in channels-last memory (a check
/// of its kernel: max error 3.4-10 against 0.02-0.1 for the same input in NCHW; libtorch 2.6 is
/// right), so there such an input is normalised in fp32 and rounded back to bf16, which is what the
/// bf16 kernel computes internally (statistics and affine in fp32).
at::Tensor group_norm(const nn::GroupNorm& norm, const at::Tensor& x);

}  // namespace fluxmpi::vae
