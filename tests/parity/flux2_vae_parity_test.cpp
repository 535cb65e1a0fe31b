// Parity of the FLUX.2 VAE decode (diffusers AutoencoderKLFlux2 and the decode tail of
// Flux2Pipeline) with the flux2/ fixtures: every `vae_decode` case with the decoder's intermediates
// (kTolFp32), and the tail of every `pipeline` case, each step from the reference input of that step
// (bn statistics, de-normalisation, vae_input, decoded_image, image_uint8) plus the whole tail from
// latents_final. Also: a FLUX.1 VAE folder given to the FLUX.2 loader is one line saying so.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <unistd.h>

#include "core/error.h"
#include "models/flux2/vae.h"
#include "models/vae/image_processor.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::flux2 {
namespace {

namespace fs = std::filesystem;
using test::expect_close;
using test::expect_identical;

// 8-bit images decoded by us from latents_final: every pixel within this many levels of the
// reference, and at least this share identical (the FLUX.1 standard, tests/parity/vae_parity_test).
constexpr int kMaxPixelDiff = 1;
constexpr double kMinIdenticalShare = 0.99;

// [H, W, 3] uint8 view of an image's pixels.
at::Tensor pixels(const io::RgbImage& img) {
  return at::from_blob(const_cast<uint8_t*>(img.pixels.data()), {img.height, img.width, 3}, at::kByte);
}

std::string vae_dir(const test::SubtreeCase& c) { return (fs::path(c.model_dir) / "vae").string(); }

// Each pipeline's VAE, loaded once in fp32 (the fixtures ran in fp32).
const Vae& vae_of(const test::SubtreeCase& c) {
  static std::map<std::string, Vae> cache;
  auto it = cache.find(c.model_dir);
  if (it == cache.end()) it = cache.emplace(c.model_dir, load_vae(vae_dir(c), at::kFloat, test::test_device())).first;
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// vae_decode cases: post_quant_conv and the decoder, batch 2, with intermediates.

class Flux2VaeDecode : public testing::TestWithParam<test::SubtreeCase> {};

TEST_P(Flux2VaeDecode, MatchesDiffusersWithIntermediates) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const Vae& vae = vae_of(c);
  DecoderTrace trace;
  const at::Tensor out = vae.decode_traced(test::on_test_device(ref.get("in_z")), &trace);
  static const std::regex up_block_re(R"(up_block_(\d+)_out)");
  int compared = 0;
  for (const auto& item : c.json.at("tensors").items()) {
    const std::string& name = item.key();
    if (name == "in_z") continue;
    at::Tensor got;
    std::smatch m;
    if (name == "post_quant_conv_out") {
      got = trace.post_quant_conv;
    } else if (name == "conv_in_out") {
      got = trace.conv_in;
    } else if (name == "mid_block_out") {
      got = trace.mid_block;
    } else if (std::regex_match(name, m, up_block_re)) {
      const size_t i = std::stoul(m[1].str());
      ASSERT_LT(i, trace.up_blocks.size()) << name << ": the decoder has only " << trace.up_blocks.size() << " up blocks";
      got = trace.up_blocks[i];
    } else if (name == "conv_norm_out_out") {
      got = trace.conv_norm_out;
    } else if (name == "out_sample") {
      got = out;
    } else {
      ADD_FAILURE() << c.name << ": reference tensor '" << name << "' has no counterpart in the decoder";
      continue;
    }
    expect_close(c.name + " " + name, got, ref.get(name), test::kTolFp32);
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(c.json.at("tensors").size()) - 1) << c.name;
  EXPECT_EQ(trace.up_blocks.size(), vae.config().decoder.block_out_channels.size());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2VaeDecode,
                         testing::ValuesIn(test::flux2_cases([](const std::string& k) { return k == "vae_decode"; })),
                         test::image_case_name);

// ---------------------------------------------------------------------------------------------
// pipeline cases: the decode tail.

class Flux2VaeTail : public testing::TestWithParam<test::SubtreeCase> {};

TEST_P(Flux2VaeTail, BatchNormStatistics) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const Vae& vae = vae_of(c);
  expect_identical(c.name + " bn_running_mean", vae.bn_mean(), ref.get("bn_running_mean"));
  expect_close(c.name + " bn_std", vae.bn_std(), ref.get("bn_std"), test::kTolFp32);
}

TEST_P(Flux2VaeTail, EachStepFromItsReferenceInput) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const Vae& vae = vae_of(c);
  expect_close(c.name + " latents_denormalized", vae.denormalize(test::on_test_device(ref.get("latents_unpacked"))),
               ref.get("latents_denormalized"), test::kTolFp32);
  expect_close(c.name + " decoded_image", vae.decode(test::on_test_device(ref.get("vae_input"))),
               ref.get("decoded_image"), test::kTolFp32);
}

TEST_P(Flux2VaeTail, WholeTailFromFinalLatents) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const Vae& vae = vae_of(c);
  const at::Tensor z = vae.vae_input(test::on_test_device(ref.get("latents_final")), ref.get("latent_ids"));
  expect_close(c.name + " vae_input (from latents_final)", z, ref.get("vae_input"), test::kTolFp32);
  const at::Tensor decoded = vae.decode(z);
  expect_close(c.name + " decoded_image (from latents_final)", decoded, ref.get("decoded_image"),
               test::kTolPipelineFp32);
  // Our own decoded floats may round to the neighbouring level where the reference sits on a
  // rounding edge: the FLUX.1 image standard (vae_parity_test) applies.
  const at::Tensor want = ref.get("image_uint8");
  const std::vector<io::RgbImage> images = vae::to_rgb_images(decoded);
  ASSERT_EQ(static_cast<int64_t>(images.size()), want.size(0));
  for (size_t i = 0; i < images.size(); ++i) {
    const at::Tensor got = pixels(images[i]).to(at::kInt);
    const at::Tensor diff = (got - want[static_cast<int64_t>(i)].to(at::kInt)).abs();
    const int64_t max_levels = diff.max().item<int64_t>();
    const double identical = diff.eq(0).to(at::kDouble).mean().item<double>();
    std::printf("[ measured ] %s image_uint8[%zu] (from latents_final): max |diff| %lld levels (tol %d), %.4f %% identical "
                "(min %.0f %%)\n",
                c.name.c_str(), i, static_cast<long long>(max_levels), kMaxPixelDiff, identical * 100.0,
                kMinIdenticalShare * 100.0);
    EXPECT_LE(max_levels, kMaxPixelDiff) << c.name << " image " << i;
    EXPECT_GE(identical, kMinIdenticalShare) << c.name << " image " << i;
  }
}

// --vae-tiling / --vae-slicing act on vae_input as for FLUX.1 (AutoencoderKLFlux2 tiles and slices
// exactly as AutoencoderKL). These latents are smaller than one tile (sample_size 1024 -> 128 latent
// cells), so tiling must leave the result as it is; slicing decodes one image at a time.
TEST_P(Flux2VaeTail, TilingAndSlicingOptions) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const Vae& vae = vae_of(c);
  const vae::TileGeometry tiles = vae::tile_geometry(vae.config().decoder);
  EXPECT_EQ(tiles.sample_tile, 1024);
  EXPECT_EQ(tiles.latent_tile, 1024 / vae.config().scale_factor());
  const at::Tensor z = test::on_test_device(ref.get("vae_input"));
  expect_close(c.name + " decoded_image (--vae-tiling --vae-slicing)", vae.decode(z, {true, true}),
               ref.get("decoded_image"), test::kTolFp32);
}

TEST_P(Flux2VaeTail, Uint8ImageFromDecodedImage) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const at::Tensor want = ref.get("image_uint8");  // [n, H, W, 3]
  const std::vector<io::RgbImage> images = vae::to_rgb_images(ref.get("decoded_image"));
  ASSERT_EQ(static_cast<int64_t>(images.size()), want.size(0));
  for (size_t i = 0; i < images.size(); ++i) {
    const io::RgbImage& img = images[i];
    ASSERT_EQ(img.height, want.size(1));
    ASSERT_EQ(img.width, want.size(2));
    const at::Tensor got = pixels(img);
    const int64_t max_levels =
        (got.to(at::kInt) - want[static_cast<int64_t>(i)].to(at::kInt)).abs().max().item<int64_t>();
    std::printf("[ measured ] %s image_uint8[%zu]: max |diff| %lld levels\n", c.name.c_str(), i,
                static_cast<long long>(max_levels));
    // Rounding the same float32 values half to even as numpy does: every level must agree.
    expect_identical(c.name + " image_uint8[" + std::to_string(i) + "]", got, want[static_cast<int64_t>(i)]);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2VaeTail,
                         testing::ValuesIn(test::flux2_cases([](const std::string& k) { return k == "pipeline"; })),
                         test::image_case_name);

// ---------------------------------------------------------------------------------------------
// Bad input.

// The message of the error `f` throws, which must be one line mentioning each of `parts`.
template <typename E, typename F>
void expect_one_line_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const E& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
    std::printf("[ message  ] %s: %s\n", e.kind(), what.c_str());
  }
}

TEST(Flux2VaeBadInput, Flux1VaeFolderIsRefusedInOneLine) {
  FLUXMPI_REQUIRE_FIXTURES();
  const std::string flux1 = (fs::path(test::fixture_root()) / "tiny-flux-dev" / "vae").string();
  expect_one_line_error<ConfigError>([&] { load_vae(flux1, at::kFloat, at::kCPU); },
                                     {flux1, "config.json", "_class_name", "AutoencoderKL", "bn.running_mean"});
  expect_one_line_error<ConfigError>([&] { check_vae(flux1); }, {flux1, "bn.running_mean"});
}

// A FLUX.2 config over FLUX.1 weights: the missing BatchNorm statistics are named, not a decoder shape.
TEST(Flux2VaeBadInput, Flux1WeightsUnderAFlux2ConfigNameTheMissingStatistics) {
  REQUIRE_FLUX2_CASE(test::flux2_cases([](const std::string& k) { return k == "vae_decode"; }).front());
  const fs::path dir = fs::temp_directory_path() / ("fluxmpi_flux2_vae_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(fs::path(test::flux2_subtree()) / "tiny-flux2-klein" / "vae" / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  fs::create_symlink(fs::path(test::fixture_root()) / "tiny-flux-dev" / "vae" / "diffusion_pytorch_model.safetensors",
                     dir / "diffusion_pytorch_model.safetensors");
  expect_one_line_error<WeightError>([&] { load_vae(dir.string(), at::kFloat, at::kCPU); },
                                     {dir.string(), "'bn.running_mean'", "'bn.running_var'", "not found"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fluxmpi::flux2
