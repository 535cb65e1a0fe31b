#pragma once
/// Initial latents as diffusers draws them with one CPU generator per image
/// (generator=[torch.Generator("cpu").manual_seed(S + i) ...]): torch.randn([1, C, h, w]) in the
/// run dtype (a bf16 draw is not a cast fp32 draw), then packed into [1, L, 4C] tokens.

#include <ATen/ATen.h>

#include "models/flux/latents.h"

namespace fluxmpi::pipeline {

/// [1, L, 4C] packed noise of one image, on the CPU, in `dtype`.
at::Tensor initial_latents(int64_t seed, const flux::LatentGeometry& geometry, at::ScalarType dtype);

}  // namespace fluxmpi::pipeline
