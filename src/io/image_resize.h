#pragma once
/// Image resizing bit for bit as Pillow 9.4's Image.resize((W, H), Image.LANCZOS) on 8-bit
/// images, which diffusers' VaeImageProcessor.resize uses for PIL inputs.

#include "io/image_file.h"

namespace fluxmpi::io {

/// Resizes `image` (any number of channels, each filtered on its own) to out_w x out_h with
/// Pillow's two-pass LANCZOS (a = 3) filter: horizontal pass first, rounded to uint8, then the
/// vertical pass; a pass whose size does not change is skipped, and the same size returns a copy.
/// No aspect preservation, no crop. out_w and out_h must be positive.
Image8 resize_lanczos(const Image8& image, int out_w, int out_h);

}  // namespace fluxmpi::io
