#include "pipeline/noise.h"

#include <ATen/CPUGeneratorImpl.h>

namespace fluxmpi::pipeline {

at::Tensor initial_latents(int64_t seed, const flux::LatentGeometry& g, at::ScalarType dtype) {
  // torch.Generator.manual_seed takes the seed as a uint64 bit pattern.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  at::Tensor noise = at::randn({1, g.channels, g.latent_height, g.latent_width}, gen, at::TensorOptions().dtype(dtype));
  return flux::pack_latents(noise);
}

}  // namespace fluxmpi::pipeline
