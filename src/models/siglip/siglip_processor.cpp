// Semantics of transformers 4.x SiglipImageProcessor.preprocess (image_processing_siglip.py) and
// the image_transforms it calls: resize (to_pil_image, PIL Image.resize, np.array), rescale
// (astype(float64) * scale, astype(float32)), normalize ((x - mean) / std with float32 mean/std).

#include "models/siglip/siglip_processor.h"

#include "core/error.h"
#include "io/image_resize.h"

namespace fluxmpi::siglip {

SiglipPixels siglip_preprocess(const io::Image8& rgb, const io::SiglipProcessorConfig& config) {
  FLUX_CHECK(rgb.channels == 3, "SigLIP preprocessing expects RGB, got ", rgb.channels, " channels");
  const int H = static_cast<int>(config.height), W = static_cast<int>(config.width);
  SiglipPixels out;
  // Pillow's resize returns a copy when the size already matches (no filtering).
  out.resized = config.resample == io::Resample::Bicubic ? io::resize_bicubic(rgb, W, H) : io::resize_lanczos(rgb, W, H);

  float mean[3], stdev[3];
  for (int c = 0; c < 3; ++c) {
    mean[c] = static_cast<float>(config.image_mean[c]);
    stdev[c] = static_cast<float>(config.image_std[c]);
  }
  // The 256 levels of each channel map to fixed floats: compute each once.
  float table[3][256];
  for (int c = 0; c < 3; ++c)
    for (int u = 0; u < 256; ++u) {
      float v = config.do_rescale ? static_cast<float>(static_cast<double>(u) * config.rescale_factor) : static_cast<float>(u);
      if (config.do_normalize) v = (v - mean[c]) / stdev[c];
      table[c][u] = v;
    }
  out.pixel_values = at::empty({1, 3, H, W}, at::TensorOptions().dtype(at::kFloat));
  float* dst = out.pixel_values.data_ptr<float>();
  const size_t plane = static_cast<size_t>(H) * W;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c)
        dst[c * plane + static_cast<size_t>(y) * W + x] = table[c][out.resized.at(y, x, c)];
  return out;
}

}  // namespace fluxmpi::siglip
