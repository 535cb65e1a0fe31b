#pragma once
/// The image side of transformers SiglipImageProcessor as FluxPriorReduxPipeline calls it
/// (preprocess(images, do_resize=True, do_convert_rgb=True)), on the PIL path of transformers 4.x:
/// Pillow resize (BICUBIC for SigLIP) to the configured size, then numpy's
/// float32(float64(u8) * rescale_factor) and (x - mean) / std in float32, channels first.

#include <ATen/ATen.h>

#include "io/image_file.h"
#include "io/redux_dir.h"

namespace fluxmpi::siglip {

struct SiglipPixels {
  at::Tensor pixel_values;  ///< [1, 3, H, W] float32 (H, W: the processor's size)
  io::Image8 resized;       ///< the RGB image after the resize (a copy when the size already matched)
};

/// `rgb`: an RGB image as io::read_image returns it (diffusers' load_image: alpha dropped, grey
/// replicated, so transformers' convert_to_rgb has nothing left to do).
SiglipPixels siglip_preprocess(const io::Image8& rgb, const io::SiglipProcessorConfig& config);

}  // namespace fluxmpi::siglip
