#pragma once
/// FluxKontextPipeline's sizes and reference tokens (diffusers 0.40, docs/images.md "Kontext"):
/// the output size comes from --max-area and the requested aspect; the reference image is encoded
/// at a preferred Kontext resolution (or its own size floored) with the VAE's mode (no draw); its
/// tokens follow the output tokens in the sequence, with position ids (1, row, col)
/// (flux::reference_position_ids).

#include <ATen/ATen.h>

#include <optional>

#include "io/image_file.h"
#include "models/vae/vae_encoder.h"

namespace fluxmpi::pipeline {

struct PixelSize {
  int64_t height = 0, width = 0;
};

/// The output size: aspect = width / height of the request (1024 x 1024 when a side is not given),
/// width = round(sqrt(max_area * aspect)), height = round(sqrt(max_area / aspect)) (half to even),
/// each floored to a multiple of `unit`.
PixelSize kontext_output_size(std::optional<int64_t> height, std::optional<int64_t> width, int64_t max_area, int64_t unit);

/// The size the reference image is encoded at: its size floored to `unit`; with `auto_resize`
/// the entry of PREFERRED_KONTEXT_RESOLUTIONS nearest in aspect (ties: smaller width, then
/// height), floored again.
PixelSize kontext_condition_size(int64_t image_height, int64_t image_width, bool auto_resize, int64_t unit);

/// The reference tokens [1, Li, 4C] in `dtype`: the image LANCZOS-resized to `size` (when it
/// differs), encoded, (mode - shift) * scale, packed.
at::Tensor kontext_reference(const io::Image8& image, PixelSize size, const vae::VaeEncoder& encoder,
                             at::ScalarType dtype, const vae::EncodeOptions& options);

}  // namespace fluxmpi::pipeline
