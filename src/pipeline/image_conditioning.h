#pragma once
/// What the image-conditioned FLUX.1 pipelines of diffusers 0.40 make of their input images before
/// the first step (docs/images.md): preprocessing, the VAE encode, the generator's draws in their
/// order, the re-noised start of img2img/inpaint/Fill, the inpaint mask, Fill's 320 extra input
/// features and Control's 64. Kontext is in pipeline/kontext.h.
///
/// One CPU generator per image (seed S + i) feeds, in order: img2img: the image sample, the noise;
/// inpaint and Fill: the image sample, the noise, (Fill) the masked-image sample; Control: the
/// control-image sample, the noise. So the noise is the generator's second draw, unlike text2img.

#include <ATen/ATen.h>

#include "io/image_file.h"
#include "models/flux/latents.h"
#include "models/vae/vae_encoder.h"
#include "pipeline/image_mode.h"
#include "sched/flow_match_euler.h"

namespace fluxmpi::pipeline {

/// The generator's draw of the latent noise, [1, C, h, w] in `dtype` (diffusers' randn_tensor).
at::Tensor draw_noise(at::Generator& gen, const flux::LatentGeometry& geometry, at::ScalarType dtype);
/// VAE encode -> latent_dist.sample(generator) (one draw) -> (z - shift) * scale: [1, C, h, w] on
/// the CPU in the encoder's dtype.
at::Tensor encode_sample(const vae::VaeEncoder& encoder, const at::Tensor& x, at::Generator& gen,
                         const vae::EncodeOptions& options);

/// The pixels of an 8-bit image as a [H, W, channels] uint8 tensor (a copy).
at::Tensor image_pixels(const io::Image8& image);

/// VaeImageProcessor.preprocess of an RGB image for an output of geometry.width x height: Pillow's
/// LANCZOS resize when the size differs (none otherwise), then float32(u8) / 255, NCHW, 2x - 1:
/// [1, 3, H, W] float32.
at::Tensor preprocess_image(const io::Image8& rgb, const flux::LatentGeometry& geometry);

/// The mask processor of FluxInpaintPipeline / FluxFillPipeline: the (RGB) mask resized with LANCZOS
/// to the output size, convert('L'), / 255, binarised at 0.5 (1 = repaint): [1, 1, H, W] float32
/// of 0 and 1.
at::Tensor preprocess_mask(const io::Image8& mask, const flux::LatentGeometry& geometry);

/// The inputs of one image.
struct ConditionInputs {
  PipelineMode mode = PipelineMode::Img2Img;
  io::Image8 image;    ///< img2img, inpaint, Fill (RGB)
  io::Image8 mask;     ///< inpaint, Fill (RGB or grey)
  io::Image8 control;  ///< Control (RGB)
  int64_t seed = 0;    ///< S + i
  int64_t t_start = 0; ///< first step of the full schedule that runs (strength_start_step)
};

/// Everything the step loop and the checkpoint need of one image, packed [1, L, *] on the CPU.
struct Conditioning {
  at::Tensor initial;   ///< [1, L, 4C] latents before the first step run, in the run dtype
  at::Tensor stored;    ///< [1, L, C_cond] float32: the checkpoint's latents/image (DESIGN.md §5)
  at::Tensor features;  ///< [1, L, E] run dtype: appended to the latents' features (Fill 320, Control 64)
  at::Tensor image_latents, noise, mask;  ///< inpaint: [1, L, 4C] each, what the per-step blend needs
  at::Tensor reference;  ///< Kontext: [1, Li, 4C] run dtype, the reference tokens after the output's
  at::Tensor controlnet;  ///< ControlNets: [1, K, L, 4C] control latents or [1, K, 3, H, W] pixels, run dtype
};

/// Computes the conditioning of one image: `encoder` in the run dtype, `full` the N-step schedule
/// (sigmas[t_start] re-noises the start), `options` the encoder's tiling/slicing.
Conditioning condition_image(const ConditionInputs& in, const vae::VaeEncoder& encoder,
                             const flux::LatentGeometry& geometry, const sched::Schedule& full,
                             at::ScalarType dtype, const vae::EncodeOptions& options);

/// scheduler.scale_noise: sigma * noise + (1 - sigma) * x0, sigma a float32 tensor as diffusers has
/// it (so the result is float32 for float32 or lower inputs).
at::Tensor scale_noise(const at::Tensor& x0, const at::Tensor& noise, float sigma);

/// FluxInpaintPipeline's blend after step `step` of the cut schedule `cut` (S steps): the stepped
/// latents inside the mask, the image latents re-noised to sigma[step + 1] outside it (the clean
/// image latents after the last step). All [m, L, 4C] (or rows of them); result in stepped's dtype.
at::Tensor inpaint_blend(const at::Tensor& stepped, const at::Tensor& image_latents, const at::Tensor& noise,
                         const at::Tensor& mask, const sched::Schedule& cut, int64_t step);

}  // namespace fluxmpi::pipeline
