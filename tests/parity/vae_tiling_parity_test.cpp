// Parity of tiled VAE decoding with diffusers AutoencoderKL.enable_tiling(), driven by the
// vae-tiling subtree's manifest (../shared/fixtures/vae-tiling): each case's `vae_input` decoded
// in tiles must give its `decoded_image` (fp32 module tolerance) and its `image_uint8`; decoded
// without tiling it must not (the case is larger than one tile, and `image_untiled_uint8` shows
// the untiled pixels).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "io/model_dir.h"
#include "models/vae/image_processor.h"
#include "models/vae/tiling.h"
#include "models/vae/vae_decoder.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::vae {
namespace {
namespace fs = std::filesystem;

struct TilingCase {
  std::string name;
  std::string file;       ///< absolute path of the tensors
  std::string model_dir;  ///< the pipeline folder
  nlohmann::json json;
};

std::string subtree() { return (fs::path(test::fixture_root()) / "vae-tiling").string(); }

std::vector<TilingCase> tiling_cases() {
  std::vector<TilingCase> out;
  const fs::path manifest = fs::path(subtree()) / "manifest.json";
  if (!fs::is_regular_file(manifest)) return {TilingCase{}};
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
  for (const auto& [pipeline, p] : m.at("pipelines").items())
    for (const auto& c : p.at("cases"))
      out.push_back({pipeline + "__" + c.at("name").get<std::string>(), (fs::path(subtree()) / c.at("file").get<std::string>()).string(),
                     fs::weakly_canonical(fs::path(subtree()) / p.at("path").get<std::string>()).string(), c});
  return out;
}

class VaeTilingParity : public testing::TestWithParam<TilingCase> {};

// 8-bit pixels: every pixel within this many levels of the reference (the module tolerance
// of the float image can move a value across a rounding boundary).
constexpr int kMaxPixelDiff = 1;

int max_pixel_diff(const io::RgbImage& got, const at::Tensor& ref_hwc) {
  at::Tensor r = ref_hwc.contiguous();
  const uint8_t* p = r.data_ptr<uint8_t>();
  int worst = 0;
  for (size_t i = 0; i < got.pixels.size(); ++i) worst = std::max(worst, std::abs(int(got.pixels[i]) - int(p[i])));
  return worst;
}

TEST_P(VaeTilingParity, TiledDecodeMatchesDiffusers) {
  const TilingCase& c = GetParam();
  FLUXMPI_REQUIRE_FIXTURES();
  if (c.name.empty()) {
    if (test::running_in_ci()) FAIL() << "no vae-tiling manifest under " << subtree();
    GTEST_SKIP() << "no vae-tiling manifest under " << subtree();
  }
  test::CaseTensors ref(c.file);
  io::ModelDir model(c.model_dir);
  VaeDecoder vae = load_vae_decoder(model, at::kFloat, at::kCPU);

  // The geometry diffusers used, as the manifest records it.
  const TileGeometry g = tile_geometry(model.vae_config());
  const nlohmann::json manifest = nlohmann::json::parse(std::ifstream(fs::path(subtree()) / "manifest.json"));
  const nlohmann::json& m = manifest.at("tiling");
  EXPECT_EQ(g.sample_tile, m.at("tile_sample_min_size").get<int64_t>());
  EXPECT_EQ(g.latent_tile, m.at("tile_latent_min_size").get<int64_t>());
  EXPECT_EQ(g.overlap, m.at("tile_overlap_factor").get<double>());

  const at::Tensor z = ref.get("vae_input");
  ASSERT_TRUE(g.applies(z.size(2), z.size(3))) << c.name << ": the case must be larger than one tile";
  const at::Tensor tiled = vae->decode(z, DecodeOptions{/*tiling=*/true, /*slicing=*/false});
  testing::AssertionResult close = test::close_to(c.name + " decoded_image (tiled)", tiled, ref.get("decoded_image"), test::kTolFp32);
  EXPECT_TRUE(close);
  std::cout << "[ measured ] " << close.message() << "\n";

  const io::RgbImage image = to_rgb_images(tiled).front();
  const int diff = max_pixel_diff(image, ref.get("image_uint8")[0]);
  EXPECT_LE(diff, kMaxPixelDiff) << c.name << " image_uint8: max |diff| " << diff << " (tol " << kMaxPixelDiff << ")";
  std::cout << "[ measured ] " << c.name << " image_uint8 (tiled): max |diff| " << diff << "\n";

  // Untiled, the same latents give the untiled reference, far from the tiled one.
  const io::RgbImage untiled = to_rgb_images(vae->decode(z, DecodeOptions{})).front();
  const int untiled_diff = max_pixel_diff(untiled, ref.get("image_untiled_uint8")[0]);
  EXPECT_LE(untiled_diff, kMaxPixelDiff) << c.name << " image_untiled_uint8: max |diff| " << untiled_diff;
  EXPECT_GT(max_pixel_diff(untiled, ref.get("image_uint8")[0]), 10) << "tiling changed nothing";

  // Slicing a batch of two gives each image as decoded alone.
  const at::Tensor batch = at::cat({z, z.flip({3})}, 0);
  const at::Tensor sliced = vae->decode(batch, DecodeOptions{true, true});
  EXPECT_TRUE(test::identical("sliced image 0", sliced[0], tiled[0]));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VaeTilingParity, testing::ValuesIn(tiling_cases()),
                         [](const testing::TestParamInfo<TilingCase>& info) {
                           std::string n = info.param.name.empty() ? "no_fixtures" : info.param.name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace fluxmpi::vae
