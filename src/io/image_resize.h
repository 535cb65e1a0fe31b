#pragma once
/// Image resizing bit for bit as Pillow's Image.resize((W, H), filter) on 8-bit images (the same
/// arithmetic in Pillow 9.4 and 11): LANCZOS, which diffusers' VaeImageProcessor.resize uses for
/// PIL inputs, and BICUBIC, which transformers' SiglipImageProcessor uses (FLUX.1 Redux).

#include "io/image_file.h"

namespace fluxmpi::io {

/// Resizes `image` (any number of channels, each filtered on its own) to out_w x out_h with
/// Pillow's two-pass LANCZOS (a = 3) filter: horizontal pass first, rounded to uint8, then the
/// vertical pass; a pass whose size does not change is skipped, and the same size returns a copy.
/// No aspect preservation, no crop. out_w and out_h must be positive.
Image8 resize_lanczos(const Image8& image, int out_w, int out_h);

/// The same two-pass scheme with Pillow's BICUBIC filter (Keys' cubic, a = -0.5, support 2).
Image8 resize_bicubic(const Image8& image, int out_w, int out_h);

}  // namespace fluxmpi::io
