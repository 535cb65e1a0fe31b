// Semantics of diffusers 0.40 Flux2Pipeline.__call__ (step 4, "process images"), Flux2ImageProcessor
// (check_image_input, _resize_to_target_area, _resize_and_crop), VaeImageProcessor.preprocess and
// prepare_image_latents / _prepare_image_ids.
#include "pipeline/flux2/references.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/image_resize.h"
#include "models/flux2/latents.h"
#include "pipeline/image_conditioning.h"

namespace fluxmpi::pipeline {
namespace {

constexpr int64_t kMinSide = 64;          // check_image_input's min_side_length
constexpr double kMaxAspect = 8.0;        // and max_aspect_ratio
constexpr int64_t kMaxArea = 1024 * 1024; // __call__: larger references go through _resize_to_target_area

// _resize_to_target_area's size: scale = sqrt(target / (w h)) in float64, each side int(side * scale).
PixelSize capped_size(int64_t height, int64_t width) {
  if (height * width <= kMaxArea) return {height, width};
  const double scale = std::sqrt(static_cast<double>(kMaxArea) / static_cast<double>(width * height));
  return {static_cast<int64_t>(static_cast<double>(height) * scale), static_cast<int64_t>(static_cast<double>(width) * scale)};
}

// Flux2ImageProcessor._resize_and_crop: the centered window (left = (w - W) // 2, top = (h - H) // 2).
io::Image8 center_crop(const io::Image8& image, PixelSize size) {
  if (image.height == size.height && image.width == size.width) return image;
  const int64_t top = (image.height - size.height) / 2, left = (image.width - size.width) / 2;
  io::Image8 out;
  out.height = static_cast<int>(size.height);
  out.width = static_cast<int>(size.width);
  out.channels = image.channels;
  out.pixels.resize(static_cast<size_t>(size.height * size.width * image.channels));
  const size_t row = static_cast<size_t>(size.width * image.channels);
  for (int64_t y = 0; y < size.height; ++y)
    std::memcpy(out.pixels.data() + static_cast<size_t>(y) * row,
                image.pixels.data() + static_cast<size_t>(((top + y) * image.width + left) * image.channels), row);
  return out;
}

}  // namespace

int64_t max_reference_images(io::Flux2Kind kind) { return kind == io::Flux2Kind::Dev ? 10 : 4; }

void check_reference_image(const std::string& what, const std::string& path, int64_t height, int64_t width) {
  if (width < kMinSide || height < kMinSide)
    throw ImageError(str_cat(what, " '", path, "': ", width, "x", height, " pixels; a FLUX.2 reference image must be at least ",
                             kMinSide, " pixels on each side (diffusers' Flux2ImageProcessor.check_image_input)"));
  const double aspect = std::max(static_cast<double>(width) / static_cast<double>(height),
                                 static_cast<double>(height) / static_cast<double>(width));
  if (aspect > kMaxAspect)
    throw ImageError(str_cat(what, " '", path, "': ", width, "x", height, " pixels, an aspect ratio over ", kMaxAspect,
                             ":1 (diffusers' Flux2ImageProcessor.check_image_input refuses it)"));
}

PixelSize reference_size(int64_t height, int64_t width, int64_t unit, PixelSize* capped) {
  FLUX_CHECK(height > 0 && width > 0 && unit > 0, "reference_size of ", width, "x", height, " (unit ", unit, ")");
  const PixelSize c = capped_size(height, width);
  if (capped != nullptr) *capped = c;
  return {c.height / unit * unit, c.width / unit * unit};
}

io::Image8 reference_pixels(const io::Image8& rgb, int64_t unit) {
  FLUX_CHECK(rgb.channels == 3, "a reference image of ", rgb.channels, " channels");
  PixelSize capped;
  const PixelSize size = reference_size(rgb.height, rgb.width, unit, &capped);
  if (capped.height == rgb.height && capped.width == rgb.width) return center_crop(rgb, size);
  return center_crop(io::resize_lanczos(rgb, static_cast<int>(capped.width), static_cast<int>(capped.height)), size);
}

at::Tensor preprocess_reference(const io::Image8& rgb, int64_t unit) {
  const io::Image8 pixels = reference_pixels(rgb, unit);
  flux::LatentGeometry g;  // preprocess_image resizes only when the size differs: here never
  g.height = pixels.height;
  g.width = pixels.width;
  return preprocess_image(pixels, g);
}

at::Tensor encode_references(const std::vector<io::Image8>& images, const flux2::VaeEncoder& encoder, int64_t unit,
                             at::ScalarType dtype, const vae::EncodeOptions& options) {
  c10::InferenceMode guard;
  std::vector<at::Tensor> tokens;
  for (const io::Image8& image : images) {
    const at::Tensor x = preprocess_reference(image, unit).to(encoder.device(), encoder.dtype());
    tokens.push_back(flux2::pack_latents(encoder.encode(x, options)).to(at::kCPU));
  }
  return at::cat(tokens, 1).to(dtype);
}

at::Tensor reference_ids_of(const std::vector<PixelSize>& sizes, int64_t vae_scale_factor) {
  std::vector<at::Tensor> ids;
  for (size_t k = 0; k < sizes.size(); ++k)
    ids.push_back(flux2::reference_ids(static_cast<int64_t>(k), sizes[k].height / vae_scale_factor / 2,
                                       sizes[k].width / vae_scale_factor / 2));
  return at::cat(ids, 0);
}

}  // namespace fluxmpi::pipeline
