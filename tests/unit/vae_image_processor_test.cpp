// Post-processing around the VAE: packed latents -> VAE input, decoded image -> 8-bit RGB.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "models/flux/latents.h"
#include "models/vae/image_processor.h"
#include "support/tensor_compare.h"

namespace fluxmpi::vae {
namespace {

// A decoded value x whose chain (x * 0.5 + 0.5) * 255 lands exactly on k + 0.5 in float32, each
// operation rounded as torch rounds it. Returns NaN when no float near the boundary does.
float exact_half_input(int k) {
  const float target = static_cast<float>(k) + 0.5f;
  float v = target / 255.0f;
  for (int i = 0; i < 64; ++i) v = std::nextafter(v, -1.0f);
  for (int i = 0; i < 128; ++i, v = std::nextafter(v, 2.0f)) {
    const float scaled = v * 255.0f;
    if (scaled != target) continue;
    const float x = (v - 0.5f) * 2.0f;
    const float half = x * 0.5f;
    if (half + 0.5f == v) return x;
  }
  return std::nanf("");
}

TEST(VaeImageProcessor, RoundsHalfToEvenAtExactBoundaries) {
  std::vector<float> inputs;
  std::vector<int> expected;
  int even = 0, odd = 0;
  for (int k = 0; k < 255; ++k) {
    const float x = exact_half_input(k);
    if (std::isnan(x)) continue;
    inputs.push_back(x);
    // numpy rounds k + 0.5 to the even neighbour: k when k is even, k + 1 when odd.
    expected.push_back(k % 2 == 0 ? k : k + 1);
    (k % 2 == 0 ? even : odd) += 1;
  }
  ASSERT_GE(even, 50) << "too few exact .5 boundaries found for even k";
  ASSERT_GE(odd, 50) << "too few exact .5 boundaries found for odd k";
  const int64_t n = static_cast<int64_t>(inputs.size());
  // The same values in all three channels: [1, 3, 1, n].
  at::Tensor row = at::from_blob(inputs.data(), {1, 1, 1, n}, at::kFloat).clone();
  std::vector<io::RgbImage> images = to_rgb_images(row.expand({1, 3, 1, n}).contiguous());
  ASSERT_EQ(images.size(), 1u);
  ASSERT_EQ(images[0].pixels.size(), static_cast<size_t>(3 * n));
  for (int64_t i = 0; i < n; ++i)
    for (int ch = 0; ch < 3; ++ch)
      ASSERT_EQ(images[0].pixels[static_cast<size_t>(3 * i + ch)], expected[static_cast<size_t>(i)])
          << "x = " << inputs[static_cast<size_t>(i)] << " maps to exactly " << expected[static_cast<size_t>(i)] - 0.5
          << " + 0.5 before rounding";
}

TEST(VaeImageProcessor, ClampsAndStoresChannelsLast) {
  // [1, 3, 2, 2]: channel c of pixel (y, x) is distinct so the layout is visible.
  at::Tensor decoded = at::tensor({-3.0f, -1.0f, 0.0f, 1.0f,      // R: 0, 0, 127.5 -> 128, 255
                                   2.0f, 0.5f, -0.5f, 1.0f,       // G: 255, 191.25 -> 191, 63.75 -> 64, 255
                                   0.25f, -0.25f, 0.999f, -0.999f})  // B: 159.375 -> 159, 95.625 -> 96, 254.87 -> 255, 0.1275 -> 0
                           .view({1, 3, 2, 2});
  std::vector<io::RgbImage> images = to_rgb_images(decoded);
  ASSERT_EQ(images.size(), 1u);
  const io::RgbImage& im = images[0];
  EXPECT_EQ(im.height, 2);
  EXPECT_EQ(im.width, 2);
  const std::vector<uint8_t> expected = {0, 255, 159, 0, 191, 96, 128, 64, 255, 255, 255, 0};
  EXPECT_EQ(im.pixels, expected);
}

TEST(VaeImageProcessor, SplitsTheBatchIntoImages) {
  at::Tensor decoded = at::stack({at::full({3, 1, 2}, -1.0f), at::full({3, 1, 2}, 1.0f)});  // [2, 3, 1, 2]
  std::vector<io::RgbImage> images = to_rgb_images(decoded);
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0].pixels, std::vector<uint8_t>(6, 0));
  EXPECT_EQ(images[1].pixels, std::vector<uint8_t>(6, 255));
}

TEST(VaeImageProcessor, DenormalisesInTheDecodedDtype) {
  // diffusers clamps in the decoder's dtype and only then converts to float32: 0.3 is 0.30078125
  // in bf16; * 0.5 + 0.5 rounds to 0.6484375 in bf16, * 255 = 165.36 -> 165, where float32 would
  // keep 0.650390625, * 255 = 165.85 -> 166.
  at::Tensor decoded = at::full({1, 3, 1, 1}, 0.3, at::kBFloat16);
  const float bf16_input = decoded.to(at::kFloat).flatten()[0].item<float>();
  const float unit = at::full({1}, bf16_input, at::kBFloat16).mul(0.5).add(0.5).to(at::kFloat).item<float>();
  const auto expected = static_cast<uint8_t>(std::nearbyint(unit * 255.0f));
  const auto fp32_path = static_cast<uint8_t>(std::nearbyint((bf16_input * 0.5f + 0.5f) * 255.0f));
  ASSERT_NE(expected, fp32_path) << "the chosen value must tell the two orders apart";
  EXPECT_EQ(to_rgb_images(decoded)[0].pixels, std::vector<uint8_t>(3, expected));
}

TEST(VaeImageProcessor, RejectsImagesThatAreNotRgb) {
  EXPECT_THROW(to_rgb_images(at::zeros({1, 4, 2, 2})), InternalError);
  EXPECT_THROW(to_rgb_images(at::zeros({3, 2, 2})), InternalError);
}

TEST(VaeImageProcessor, VaeInputUnpacksThenDividesThenAdds) {
  io::VaeConfig config;
  config.latent_channels = 2;
  config.scaling_factor = 0.5;
  config.shift_factor = 0.25;
  config.block_out_channels = {8, 8};  // scale factor 2
  flux::LatentGeometry g = flux::latent_geometry(8, 12, config.scale_factor(), config.latent_channels);
  ASSERT_EQ(g.latent_height, 4);
  ASSERT_EQ(g.latent_width, 6);
  // packed [2, L = 2 * 3, 8]: distinct values.
  at::Tensor packed = at::arange(2 * g.tokens() * g.token_dim(), at::kFloat).view({2, g.tokens(), g.token_dim()});
  at::Tensor got = vae_input_from_packed(packed, g, config);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 2, 4, 6}));
  // Packed layout: token (y/2) * (w/2) + x/2, feature c * 4 + (y % 2) * 2 + x % 2.
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t y = 0; y < 4; ++y)
        for (int64_t x = 0; x < 6; ++x) {
          const float p = packed[b][(y / 2) * 3 + x / 2][c * 4 + (y % 2) * 2 + x % 2].item<float>();
          // p / 0.5 + 0.25, not (p + 0.25) / 0.5 nor p * 0.5 + 0.25.
          ASSERT_FLOAT_EQ(got[b][c][y][x].item<float>(), p / 0.5f + 0.25f) << "at " << b << "," << c << "," << y << "," << x;
        }
}

TEST(VaeImageProcessor, VaeInputRejectsMismatchedLatents) {
  io::VaeConfig config;
  config.latent_channels = 16;
  config.block_out_channels = {8, 8, 8, 8};
  flux::LatentGeometry g = flux::latent_geometry(64, 64, config.scale_factor(), config.latent_channels);
  EXPECT_THROW(vae_input_from_packed(at::zeros({1, g.tokens() + 1, 64}), g, config), InternalError);
  EXPECT_THROW(vae_input_from_packed(at::zeros({1, g.tokens(), 32}), g, config), InternalError);
  config.latent_channels = 4;
  EXPECT_THROW(vae_input_from_packed(at::zeros({1, g.tokens(), 64}), g, config), InternalError);
}

}  // namespace
}  // namespace fluxmpi::vae
