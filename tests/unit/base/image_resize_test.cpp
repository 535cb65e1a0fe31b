// LANCZOS resize against Pillow 9.4: every resize of the image-inputs fixtures bit for bit, the
// processors' float inputs and binarised masks that follow it, and the properties of Pillow's
// two-pass scheme on synthetic images.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "image_cases.h"
#include "io/image_resize.h"

namespace fluxmpi::io {
namespace {

using test::compare_images;
using test::ImageArg;

Image8 noise(int width, int height, int channels, unsigned seed) {
  std::mt19937 rng(seed);
  Image8 im{width, height, channels, std::vector<uint8_t>(static_cast<size_t>(width) * height * channels)};
  for (uint8_t& v : im.pixels) v = static_cast<uint8_t>(rng() & 0xFF);
  return im;
}

Image8 row_of(const Image8& im, int y) {
  const size_t n = static_cast<size_t>(im.width) * im.channels;
  Image8 r{im.width, 1, im.channels, {}};
  r.pixels.assign(im.pixels.begin() + y * n, im.pixels.begin() + (y + 1) * n);
  return r;
}

Image8 transposed(const Image8& im) {
  Image8 t{im.height, im.width, im.channels, std::vector<uint8_t>(im.pixels.size())};
  for (int y = 0; y < im.height; ++y)
    for (int x = 0; x < im.width; ++x)
      for (int c = 0; c < im.channels; ++c)
        t.pixels[(static_cast<size_t>(x) * t.width + y) * im.channels + c] = im.at(y, x, c);
  return t;
}

class ImageResizeFixture : public testing::TestWithParam<ImageArg> {};

// The recorded resize of each image argument (Pillow's, from the recorded load_image output, so
// that this does not depend on the decoders), then what the processor makes of the result.
TEST_P(ImageResizeFixture, MatchesPillowAndTheProcessor) {
  const ImageArg& a = GetParam();
  FLUXMPI_REQUIRE_IMAGE_CASE(a);
  SafetensorsFile f(a.tensors);
  const Image8 input = test::fixture_image(f, a.input, a.index);
  Image8 sized = input;
  if (!a.resized.empty()) {
    const Image8 want = test::fixture_image(f, a.resized, a.index);
    sized = resize_lanczos(input, want.width, want.height);
    EXPECT_EQ(compare_images(sized, want), "identical")
        << a.resized << ": " << input.width << "x" << input.height << " -> " << want.width << "x" << want.height
        << ", tolerance 0";
  }
  if (a.preprocessed.empty()) return;
  const TensorEntry* e = f.find(a.preprocessed);
  ASSERT_NE(e, nullptr) << a.preprocessed;
  ASSERT_EQ(e->dtype, DType::F32);
  ASSERT_EQ(e->shape.size(), 4u);
  const int C = static_cast<int>(e->shape[1]), H = static_cast<int>(e->shape[2]), W = static_cast<int>(e->shape[3]);
  ASSERT_EQ(C, a.mask ? 1 : 3) << a.preprocessed;
  // A preprocess without a recorded resize is at the input's size: the resize returns a copy.
  const Image8 pixels = a.mask ? binarize_mask(to_grey(resize_lanczos(input, W, H))) : resize_lanczos(input, W, H);
  if (!a.resized.empty()) {
    EXPECT_EQ(compare_images(resize_lanczos(input, W, H), sized), "identical") << "processor size != recorded resize";
  }
  const float* want = reinterpret_cast<const float*>(f.data(*e)) + static_cast<size_t>(a.index) * C * H * W;
  size_t differ = 0;
  double max_diff = 0;
  for (int c = 0; c < C; ++c) {
    for (int y = 0; y < H; ++y) {
      for (int x = 0; x < W; ++x) {
        const uint8_t u = pixels.at(y, x, c);
        // Images: numpy float32(u8) / 255, then torch's 2x - 1 in float32; masks: binarised 0 / 1.
        const float got = a.mask ? static_cast<float>(u) : 2.0f * (static_cast<float>(u) / 255.0f) - 1.0f;
        const float w = want[(static_cast<size_t>(c) * H + y) * W + x];
        if (std::memcmp(&got, &w, sizeof got) != 0) {
          ++differ;
          max_diff = std::max(max_diff, std::fabs(static_cast<double>(got) - w));
        }
      }
    }
  }
  EXPECT_EQ(differ, 0u) << a.preprocessed << ": " << differ << " of " << C * H * W
                        << " values differ, max |diff| " << max_diff << " > 0 (float32, bit-exact expected)";
}

INSTANTIATE_TEST_SUITE_P(ImageInputs, ImageResizeFixture, testing::ValuesIn(test::image_args()), test::image_arg_name);

TEST(ImageResize, SameSizeIsAnUntouchedCopy) {
  const Image8 im = noise(7, 5, 3, 1);
  EXPECT_EQ(compare_images(resize_lanczos(im, 7, 5), im), "identical");
}

// Two input pixels into one: both taps weigh exactly one half, and the sum starts at one half of
// the last unit, so the result is floor((a + b + 1) / 2).
TEST(ImageResize, HalvingAveragesPairsRoundingHalfUp) {
  const Image8 im{2, 1, 1, {10, 13}};
  EXPECT_EQ(resize_lanczos(im, 1, 1).pixels, std::vector<uint8_t>{12});
  const Image8 edge{2, 1, 1, {0, 255}};
  EXPECT_EQ(resize_lanczos(edge, 1, 1).pixels, std::vector<uint8_t>{128});
}

TEST(ImageResize, ConstantImagesStayConstant) {
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{3, 2}, {31, 17}, {100, 75}, {1248, 832}}) {
    for (int v : {0, 1, 127, 128, 254, 255}) {
      const Image8 im{10, 8, 1, std::vector<uint8_t>(80, static_cast<uint8_t>(v))};
      const Image8 out = resize_lanczos(im, w, h);
      for (uint8_t p : out.pixels) ASSERT_EQ(p, v) << "10x8 -> " << w << "x" << h;
    }
  }
}

// A pass whose size does not change is skipped: changing the width only filters each row alone,
// changing the height only each column alone.
TEST(ImageResize, OnlyTheChangedPassRuns) {
  const Image8 im = noise(23, 9, 3, 2);
  const Image8 wide = resize_lanczos(im, 37, 9);
  for (int y = 0; y < im.height; ++y) {
    ASSERT_EQ(compare_images(resize_lanczos(row_of(im, y), 37, 1), row_of(wide, y)), "identical") << "row " << y;
  }
  const Image8 tall = resize_lanczos(im, 23, 4);
  EXPECT_EQ(compare_images(transposed(tall), resize_lanczos(transposed(im), 4, 23)), "identical");
}

// Horizontal first, rounded to uint8 in between: the same as two calls in that order, and (on
// noise) not the same as the vertical pass first.
TEST(ImageResize, HorizontalPassFirstThroughUint8) {
  const Image8 im = noise(40, 30, 1, 3);
  const Image8 both = resize_lanczos(im, 17, 11);
  EXPECT_EQ(compare_images(both, resize_lanczos(resize_lanczos(im, 17, 30), 17, 11)), "identical");
  EXPECT_NE(compare_images(both, resize_lanczos(resize_lanczos(im, 40, 11), 17, 11)), "identical");
}

TEST(ImageResize, ChannelsAreFilteredAlone) {
  const Image8 grey = noise(19, 13, 1, 4);
  Image8 rgb{19, 13, 3, {}};
  for (uint8_t v : grey.pixels) rgb.pixels.insert(rgb.pixels.end(), {v, static_cast<uint8_t>(255 - v), 7});
  const Image8 g = resize_lanczos(grey, 64, 5), c = resize_lanczos(rgb, 64, 5);
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 64; ++x) {
      ASSERT_EQ(c.at(y, x, 0), g.at(y, x)) << "(" << y << ", " << x << ")";
      ASSERT_EQ(c.at(y, x, 2), 7);
    }
  }
}

TEST(ImageResize, RejectsEmptyTargets) {
  const Image8 im = noise(4, 4, 3, 5);
  EXPECT_THROW(resize_lanczos(im, 0, 4), InternalError);
  EXPECT_THROW(resize_lanczos(im, 4, -1), InternalError);
}

}  // namespace
}  // namespace fluxmpi::io
