// Semantics of Pillow ImagingResample (src/libImaging/Resample.c, unchanged from 9.4 to 11) for
// 8-bit images, LANCZOS and BICUBIC filters, box = the whole image.
#include "io/image_resize.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace fluxmpi::io {
namespace {

// Fixed point of the 8-bit passes: 32 bits less 8 for the sample and 2 for the overshoot of
// negative lobes.
constexpr int kPrecisionBits = 32 - 8 - 2;

// The double-precision expressions below are written in Pillow's order of operations: the
// coefficients are rounded to 22 bits afterwards, so a different rounding of an intermediate
// value can move a coefficient by one unit and a pixel by one level.
double sinc(double x) {
  if (x == 0.0) return 1.0;
  x = x * M_PI;
  return std::sin(x) / x;
}

double lanczos(double x) {
  if (-3.0 <= x && x < 3.0) return sinc(x) * sinc(x / 3);
  return 0.0;
}

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// A filter and the half-width it is non-zero on, as Pillow's `struct filter`.
struct Filter {
  double (*fn)(double);
  double support;
};
constexpr Filter kLanczos{lanczos, 3.0};
constexpr Filter kBicubic{bicubic, 2.0};

// The taps of one pass: output sample i reads `count[i]` input samples from `first[i]` with the
// weights `weights[i * ksize ...]`.
struct Taps {
  int ksize = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;
};

Taps filter_taps(const Filter& filter, int in_size, int out_size) {
  // Pillow computes the box width in float (exact below 2^24) before dividing in double.
  const double scale = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filter.support * filterscale;
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weights.assign(static_cast<size_t>(out_size) * t.ksize, 0);
  std::vector<double> k(t.ksize);
  for (int i = 0; i < out_size; ++i) {
    const double center = 0.0 + (i + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // int() truncates toward zero, as Pillow's cast does; the clamps make the sign moot.
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    const int n = xmax - xmin;
    double ww = 0.0;
    for (int x = 0; x < n; ++x) {
      const double w = filter.fn((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < n; ++x) {
      if (ww != 0.0) k[x] /= ww;
    }
    int32_t* q = &t.weights[static_cast<size_t>(i) * t.ksize];
    for (int x = 0; x < n; ++x) {
      // Round half away from zero.
      q[x] = k[x] < 0 ? static_cast<int32_t>(-0.5 + k[x] * (1 << kPrecisionBits))
                      : static_cast<int32_t>(0.5 + k[x] * (1 << kPrecisionBits));
    }
    t.first[i] = xmin;
    t.count[i] = n;
  }
  return t;
}

// Pillow starts the sum at one half and takes floor(sum / 2^22) through a table clamped to
// [0, 255].
uint8_t clip8(int64_t sum) {
  const int64_t v = sum >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

Image8 horizontal_pass(const Filter& filter, const Image8& in, int out_w) {
  const Taps t = filter_taps(filter, in.width, out_w);
  const int C = in.channels;
  Image8 out{out_w, in.height, C, std::vector<uint8_t>(static_cast<size_t>(out_w) * in.height * C)};
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* row = &in.pixels[static_cast<size_t>(y) * in.width * C];
    uint8_t* dst = &out.pixels[static_cast<size_t>(y) * out_w * C];
    for (int i = 0; i < out_w; ++i) {
      const int32_t* k = &t.weights[static_cast<size_t>(i) * t.ksize];
      const uint8_t* src = row + static_cast<size_t>(t.first[i]) * C;
      for (int c = 0; c < C; ++c) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (int x = 0; x < t.count[i]; ++x) sum += int64_t{src[x * C + c]} * k[x];
        dst[i * C + c] = clip8(sum);
      }
    }
  }
  return out;
}

Image8 vertical_pass(const Filter& filter, const Image8& in, int out_h) {
  const Taps t = filter_taps(filter, in.height, out_h);
  const int C = in.channels;
  const size_t row_len = static_cast<size_t>(in.width) * C;
  Image8 out{in.width, out_h, C, std::vector<uint8_t>(row_len * out_h)};
  std::vector<int64_t> sums(row_len);
  for (int j = 0; j < out_h; ++j) {
    const int32_t* k = &t.weights[static_cast<size_t>(j) * t.ksize];
    std::fill(sums.begin(), sums.end(), int64_t{1} << (kPrecisionBits - 1));
    for (int y = 0; y < t.count[j]; ++y) {
      const uint8_t* src = &in.pixels[static_cast<size_t>(t.first[j] + y) * row_len];
      for (size_t s = 0; s < row_len; ++s) sums[s] += int64_t{src[s]} * k[y];
    }
    uint8_t* dst = &out.pixels[static_cast<size_t>(j) * row_len];
    for (size_t s = 0; s < row_len; ++s) dst[s] = clip8(sums[s]);
  }
  return out;
}

Image8 resize_with(const Filter& filter, const Image8& image, int out_w, int out_h) {
  FLUX_CHECK(out_w > 0 && out_h > 0, "resize to ", out_w, "x", out_h);
  FLUX_CHECK(image.width > 0 && image.height > 0 && image.channels > 0 &&
                 image.pixels.size() == static_cast<size_t>(image.width) * image.height * image.channels,
             "bad image buffer ", image.width, "x", image.height, "x", image.channels);
  if (out_w == image.width && out_h == image.height) return image;
  if (out_w == image.width) return vertical_pass(filter, image, out_h);
  Image8 h = horizontal_pass(filter, image, out_w);
  if (out_h == image.height) return h;
  return vertical_pass(filter, h, out_h);
}

}  // namespace

Image8 resize_lanczos(const Image8& image, int out_w, int out_h) { return resize_with(kLanczos, image, out_w, out_h); }

Image8 resize_bicubic(const Image8& image, int out_w, int out_h) { return resize_with(kBicubic, image, out_w, out_h); }

}  // namespace fluxmpi::io
