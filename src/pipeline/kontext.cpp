#include "pipeline/kontext.h"

#include <c10/core/InferenceMode.h>

#include <cmath>
#include <tuple>

#include "core/error.h"
#include "models/flux/latents.h"
#include "pipeline/image_conditioning.h"

namespace fluxmpi::pipeline {
namespace {

// diffusers' PREFERRED_KONTEXT_RESOLUTIONS, (width, height): the ~1 megapixel sizes Kontext was
// trained at.
constexpr std::pair<int64_t, int64_t> kPreferred[] = {
    {672, 1568}, {688, 1504}, {720, 1456}, {752, 1392}, {800, 1328}, {832, 1248},
    {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880}, {1248, 832},
    {1328, 800}, {1392, 752}, {1456, 720}, {1504, 688}, {1568, 672},
};

// Python's round() of a float64: half to even (the default rounding mode of nearbyint).
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

}  // namespace

PixelSize kontext_output_size(std::optional<int64_t> height, std::optional<int64_t> width, int64_t max_area, int64_t unit) {
  FLUX_CHECK(max_area > 0 && unit > 0, "max_area ", max_area, ", unit ", unit);
  const double aspect = static_cast<double>(width.value_or(1024)) / static_cast<double>(height.value_or(1024));
  const int64_t w = round_half_even(std::sqrt(static_cast<double>(max_area) * aspect));
  const int64_t h = round_half_even(std::sqrt(static_cast<double>(max_area) / aspect));
  return {h / unit * unit, w / unit * unit};
}

PixelSize kontext_condition_size(int64_t image_height, int64_t image_width, bool auto_resize, int64_t unit) {
  int64_t h = image_height - image_height % unit, w = image_width - image_width % unit;
  if (auto_resize && h > 0) {
    const double aspect = static_cast<double>(w) / static_cast<double>(h);
    std::tuple<double, int64_t, int64_t> best{INFINITY, 0, 0};
    for (auto [pw, ph] : kPreferred)
      best = std::min(best, std::make_tuple(std::abs(aspect - static_cast<double>(pw) / static_cast<double>(ph)), pw, ph));
    w = std::get<1>(best);
    h = std::get<2>(best);
  }
  return {h / unit * unit, w / unit * unit};
}

at::Tensor kontext_reference(const io::Image8& image, PixelSize size, const vae::VaeEncoder& encoder,
                             at::ScalarType dtype, const vae::EncodeOptions& options) {
  c10::InferenceMode guard;
  flux::LatentGeometry g;
  g.height = size.height;
  g.width = size.width;
  const at::Tensor x = preprocess_image(image, g);
  vae::LatentDistribution dist = encoder->encode(x.to(encoder->dtype()), options);
  return flux::pack_latents(encoder->normalize(dist.mode()).to(at::kCPU)).to(dtype);
}

}  // namespace fluxmpi::pipeline
