#include "pipeline/controlnet_inputs.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "pipeline/image_conditioning.h"

namespace fluxmpi::pipeline {

ControlNetConditioning controlnet_conditioning(const std::vector<io::Image8>& images, bool pixels, int64_t seed,
                                              const vae::VaeEncoder* encoder, const flux::LatentGeometry& g,
                                              at::ScalarType dtype, const vae::EncodeOptions& options) {
  c10::InferenceMode guard;
  // torch.Generator.manual_seed takes the seed as a uint64 bit pattern.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  ControlNetConditioning out;
  for (const io::Image8& image : images) {
    const at::Tensor x = preprocess_image(image, g);
    if (pixels) {
      out.controls.push_back(x.to(dtype));
      continue;
    }
    FLUX_CHECK(encoder != nullptr, "ControlNet control latents without a VAE encoder");
    out.controls.push_back(flux::pack_latents(encode_sample(*encoder, x, gen, options).to(dtype)));
  }
  out.initial = flux::pack_latents(draw_noise(gen, g, dtype));
  return out;
}

}  // namespace fluxmpi::pipeline
