// BICUBIC resize against Pillow (the SigLIP processor's filter, FLUX.1 Redux): every resize of the
// redux fixture cases bit for bit, the decoded inputs they start from, and the properties of the
// filter on synthetic images.

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <stdexcept>

#include "core/error.h"
#include "io/image_file.h"
#include "io/image_resize.h"
#include "io/safetensors.h"
#include "support/subtree_cases.h"

namespace fluxmpi::io {
namespace {

// "identical", or how two images differ.
std::string compare_images(const Image8& got, const Image8& want) {
  if (got.width != want.width || got.height != want.height || got.channels != want.channels)
    return "shape " + std::to_string(got.height) + "x" + std::to_string(got.width) + " != " +
           std::to_string(want.height) + "x" + std::to_string(want.width);
  size_t differ = 0;
  int max_diff = 0;
  for (size_t i = 0; i < got.pixels.size(); ++i) {
    const int d = std::abs(int{got.pixels[i]} - int{want.pixels[i]});
    differ += d != 0;
    max_diff = std::max(max_diff, d);
  }
  if (differ == 0) return "identical";
  return std::to_string(differ) + " of " + std::to_string(got.pixels.size()) + " samples differ, max |diff| " +
         std::to_string(max_diff);
}

// Image `index` of a recorded [n, H, W, 3] uint8 tensor.
Image8 recorded_image(const SafetensorsFile& f, const std::string& name, int index) {
  const TensorEntry* e = f.find(name);
  if (e == nullptr || e->dtype != DType::U8 || e->shape.size() != 4 || e->shape[3] != 3 || index >= e->shape[0])
    throw std::runtime_error("'" + f.path() + "': no [n, H, W, 3] uint8 tensor '" + name + "'");
  Image8 im{static_cast<int>(e->shape[2]), static_cast<int>(e->shape[1]), 3, {}};
  const size_t n = static_cast<size_t>(im.width) * im.height * 3;
  const uint8_t* p = f.data(*e) + n * index;
  im.pixels.assign(p, p + n);
  return im;
}

Image8 noise(int width, int height, int channels, unsigned seed) {
  std::mt19937 rng(seed);
  Image8 im{width, height, channels, std::vector<uint8_t>(static_cast<size_t>(width) * height * channels)};
  for (uint8_t& v : im.pixels) v = static_cast<uint8_t>(rng() & 0xFF);
  return im;
}

std::vector<test::SubtreeCase> encode_cases() {
  return test::project_subtree_cases("redux", [](const std::string& kind) { return kind == "redux_encode"; });
}

class ReduxInputImage : public testing::TestWithParam<test::SubtreeCase> {};

// load_image's decode (EXIF, convert('RGB'): grey, palette, alpha dropped), then Pillow's BICUBIC
// resize to the processor's size, both exact.
TEST_P(ReduxInputImage, DecodesAndResizesAsPillow) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "redux");
  SafetensorsFile f(c.file);
  const Image8 want_in = recorded_image(f, "in_image_uint8", 0);
  const std::string input = c.subtree + "/" + c.json.at("inputs").at(0).get<std::string>();
  EXPECT_EQ(compare_images(read_image(input), want_in), "identical") << input << " (" << c.json.value("input_mode", "") << ")";
  const Image8 want = recorded_image(f, "resized_uint8", 0);
  EXPECT_EQ(compare_images(resize_bicubic(want_in, want.width, want.height), want), "identical")
      << c.name << ": " << want_in.width << "x" << want_in.height << " -> " << want.width << "x" << want.height
      << ", tolerance 0";
}

INSTANTIATE_TEST_SUITE_P(Redux, ReduxInputImage, testing::ValuesIn(encode_cases()), test::image_case_name);

TEST(ImageBicubic, SameSizeIsAnUntouchedCopy) {
  const Image8 im = noise(7, 5, 3, 1);
  EXPECT_EQ(compare_images(resize_bicubic(im, 7, 5), im), "identical");
}

TEST(ImageBicubic, ConstantImagesStayConstant) {
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{3, 2}, {31, 17}, {384, 384}, {1000, 3}}) {
    for (int v : {0, 1, 127, 128, 254, 255}) {
      const Image8 im{10, 8, 1, std::vector<uint8_t>(80, static_cast<uint8_t>(v))};
      for (uint8_t p : resize_bicubic(im, w, h).pixels) ASSERT_EQ(p, v) << "10x8 -> " << w << "x" << h;
    }
  }
}

// Doubling a row: output sample 3 is centred on input 1.75 and reads inputs 0..3 with Keys' cubic
// (a = -0.5) at distances 1.25, 0.25, 0.75, 1.75: weights -0.0703125, 0.8671875, 0.2265625,
// -0.0234375 (summing to 1). On {0, 0, 255, 255} that is 255 * 0.203125 = 51.8.
TEST(ImageBicubic, UpscalingUsesKeysCubic) {
  const Image8 row{4, 1, 1, {0, 0, 255, 255}};
  const Image8 out = resize_bicubic(row, 8, 1);
  EXPECT_NEAR(out.pixels[3], 255 * (0.2265625 - 0.0234375), 0.5);
  EXPECT_NEAR(out.pixels[4], 255 * (0.8671875 - 0.0703125), 0.5);  // the mirror image: 203.2
  EXPECT_EQ(out.pixels[0], 0);
  EXPECT_EQ(out.pixels[7], 255);
}

// Pillow clamps the overshoot of the negative lobes to [0, 255].
TEST(ImageBicubic, OvershootIsClamped) {
  const Image8 step{6, 1, 1, {0, 0, 0, 255, 255, 255}};
  const Image8 out = resize_bicubic(step, 17, 1);
  for (uint8_t p : out.pixels) {
    EXPECT_GE(p, 0);
    EXPECT_LE(p, 255);
  }
  EXPECT_EQ(out.pixels.front(), 0);
  EXPECT_EQ(out.pixels.back(), 255);
}

TEST(ImageBicubic, DiffersFromLanczos) {
  const Image8 im = noise(40, 30, 3, 3);
  EXPECT_NE(compare_images(resize_bicubic(im, 17, 11), resize_lanczos(im, 17, 11)), "identical");
}

TEST(ImageBicubic, RejectsEmptyTargets) {
  const Image8 im = noise(4, 4, 3, 5);
  EXPECT_THROW(resize_bicubic(im, 0, 4), InternalError);
}

}  // namespace
}  // namespace fluxmpi::io
