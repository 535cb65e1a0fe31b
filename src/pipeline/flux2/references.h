#pragma once
/// The reference images of Flux2Pipeline / Flux2KleinPipeline(image=[...]) (diffusers 0.40,
/// docs/flux2.md "Multi-reference editing"), image by image as __call__ and prepare_image_latents
/// make them:
///
///   1. Flux2ImageProcessor.check_image_input: both sides at least 64 pixels, aspect ratio at most 8;
///   2. more than 1024 x 1024 pixels: _resize_to_target_area, LANCZOS to int(w s) x int(h s) with
///      s = sqrt(1024^2 / (w h));
///   3. the size floored to 2 x vae_scale_factor, the image center-cropped to it (the processor's
///      "crop" resize mode crops, it does not scale), float32(u8) / 255, NCHW, 2x - 1;
///   4. the FLUX.2 VAE's encode: the mode, patchified, normalised (flux2::VaeEncoder), packed;
///   5. the references' tokens concatenated in order, each with ids (10 + 10 k, row, col, 0).
///
/// The output size, when --height/--width are not given, is the first reference's size after
/// steps 2 and 3 (`height = height or image_height`).

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/flux2_configs.h"
#include "io/image_file.h"
#include "models/flux2/vae_encoder.h"
#include "pipeline/kontext.h"

namespace fluxmpi::pipeline {

/// The most reference images a FLUX.2 model takes (Black Forest Labs' documented limits: [klein]
/// up to 4, [dev] up to 10); diffusers itself sets none.
int64_t max_reference_images(io::Flux2Kind kind);

/// check_image_input's bounds: ImageError "<what> '<path>': W x H pixels; ..." for a side under 64
/// pixels or an aspect ratio over 8.
void check_reference_image(const std::string& what, const std::string& path, int64_t height, int64_t width);

/// The size a reference of height x width pixels is encoded at: capped at 1024 x 1024 pixels as
/// _resize_to_target_area caps it, then floored to `unit` (2 x vae_scale_factor). `capped` (optional)
/// receives the size after the cap, before the floor.
PixelSize reference_size(int64_t height, int64_t width, int64_t unit, PixelSize* capped = nullptr);

/// The pixels the VAE encoder sees: the RGB image capped (LANCZOS) and center-cropped to
/// reference_size.
io::Image8 reference_pixels(const io::Image8& rgb, int64_t unit);
/// reference_pixels as the VAE encoder gets them: [1, 3, H, W] float32 in [-1, 1].
at::Tensor preprocess_reference(const io::Image8& rgb, int64_t unit);

/// The references' tokens: each image preprocessed, encoded (`options`: tiling, slicing) and
/// packed to [1, L_k, 4C]; concatenated in order -> [1, sum L_k, 4C] in `dtype` on the CPU.
at::Tensor encode_references(const std::vector<io::Image8>& images, const flux2::VaeEncoder& encoder, int64_t unit,
                             at::ScalarType dtype, const vae::EncodeOptions& options);

/// The references' position ids [sum L_k, 4] int64 (diffusers' image_latent_ids) for references
/// encoded at `sizes` (pixels) with `vae_scale_factor` pixels per latent cell.
at::Tensor reference_ids_of(const std::vector<PixelSize>& sizes, int64_t vae_scale_factor);

}  // namespace fluxmpi::pipeline
