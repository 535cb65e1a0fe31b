// Parity of the VAE decoder and of the image post-processing with diffusers AutoencoderKL and
// FluxPipeline, driven by the fixture manifest: every `vae_decode` case (with the decoder's
// intermediates) and the decode tail of every `pipeline` case (vae_input, decoded_image,
// image_uint8 and the reference PNGs). The decoder runs on test::test_device() (FLUXMPI_TEST_DEVICE).

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>

#include "core/error.h"
#include "io/model_dir.h"
#include "io/png.h"
#include "models/common/winograd_conv.h"
#include "models/flux/latents.h"
#include "models/vae/image_processor.h"
#include "models/vae/norm.h"
#include "models/vae/vae_decoder.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::vae {
namespace {
using test::expect_close;

using test::CaseRef;

// 8-bit images: every pixel within this many levels of the reference ...
constexpr int kMaxPixelDiff = 1;
// ... and at least this share of the channel values identical.
constexpr double kMinIdenticalShare = 0.99;

// Each pipeline's VAE, loaded once in fp32 (the fixtures ran in fp32; bf16 weights upcast exactly).
VaeDecoder& decoder_of(const CaseRef& c) {
  static std::map<std::string, VaeDecoder> cache;
  auto it = cache.find(c.model_dir);
  if (it == cache.end())
    it = cache.emplace(c.model_dir, load_vae_decoder(io::ModelDir(c.model_dir), at::kFloat, test::test_device())).first;
  return it->second;
}

// Compares 8-bit RGB pixels (HWC) with a reference of the same layout.
void expect_pixels_close(const std::string& what, const io::RgbImage& got, const uint8_t* ref, int64_t ref_height,
                         int64_t ref_width) {
  ASSERT_EQ(got.height, ref_height) << what << ": image height";
  ASSERT_EQ(got.width, ref_width) << what << ": image width";
  const size_t n = got.pixels.size();
  int max_diff = 0;
  size_t identical = 0;
  for (size_t i = 0; i < n; ++i) {
    const int d = std::abs(static_cast<int>(got.pixels[i]) - static_cast<int>(ref[i]));
    max_diff = std::max(max_diff, d);
    identical += d == 0;
  }
  const double share = n == 0 ? 1.0 : static_cast<double>(identical) / static_cast<double>(n);
  const std::string measured = str_cat(what, ": max |diff| ", max_diff, " (tol ", kMaxPixelDiff, "), identical ",
                                       identical, "/", n, " = ", share * 100.0, " % (min ", kMinIdenticalShare * 100.0,
                                       " %)");
  EXPECT_LE(max_diff, kMaxPixelDiff) << measured;
  EXPECT_GE(share, kMinIdenticalShare) << measured;
  std::cout << "[ measured ] " << measured << "\n";
}

// ---------------------------------------------------------------------------------------------
// vae_decode cases: the decoder alone, batch 2, with intermediates.

// The opt-in CPU kernels (Winograd convolutions, winograd_conv.h; the channels-last group norm,
// norm.h) switched on for one scope; both are off by default.
class OptInKernels {
 public:
  explicit OptInKernels(bool on) {
    nn::set_winograd(on);
    set_group_norm_nhwc(on);
  }
  ~OptInKernels() {
    nn::set_winograd(false);
    set_group_norm_nhwc(false);
  }
  OptInKernels(const OptInKernels&) = delete;
  OptInKernels& operator=(const OptInKernels&) = delete;
};

class VaeDecodeParity : public testing::TestWithParam<CaseRef> {};

void expect_decode_parity(const CaseRef& c, const std::string& label) {
  test::CaseTensors ref(c.file);
  VaeDecoder& vae = decoder_of(c);
  DecoderTrace trace;
  at::Tensor out = vae->forward(test::on_test_device(ref.get("in_z")), &trace);

  // Every reference tensor the manifest lists for the case is compared; an unknown one fails.
  static const std::regex up_block_re(R"(up_block_(\d+)_out)");
  int compared = 0;
  for (const auto& item : c.json["tensors"].items()) {
    const std::string& name = item.key();
    if (name == "in_z") continue;
    at::Tensor got;
    std::smatch m;
    if (name == "conv_in_out") {
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
      ADD_FAILURE() << test::case_label(c) << ": reference tensor '" << name << "' has no counterpart in the decoder";
      continue;
    }
    expect_close(label + " " + name, got, ref.get(name), test::kTolFp32);
    ++compared;
  }
  EXPECT_GT(compared, 0) << test::case_label(c) << ": no reference tensor compared";
  EXPECT_EQ(trace.up_blocks.size(), vae->config().block_out_channels.size());
}

TEST_P(VaeDecodeParity, MatchesDiffusersWithIntermediates) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  expect_decode_parity(c, test::case_label(c));
}

TEST_P(VaeDecodeParity, MatchesDiffusersWithTheOptInKernels) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  const OptInKernels on(true);
  expect_decode_parity(c, test::case_label(c) + " (Winograd, group_norm_nhwc)");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VaeDecodeParity, testing::ValuesIn(test::cases_of_kind("vae_decode")),
                         test::case_test_name);

// ---------------------------------------------------------------------------------------------
// pipeline cases: the steps after denoising, each from the reference input of that step.

class VaePipelineTailParity : public testing::TestWithParam<CaseRef> {
 protected:
  void SetUp() override {
    const CaseRef& c = GetParam();
    if (c.pipeline.empty()) return;
    io::ModelDir model(c.model_dir);
    config_ = model.vae_config();
    const auto& call = c.json["call"];
    geometry_ = flux::latent_geometry(call["height"].get<int64_t>(), call["width"].get<int64_t>(),
                                      config_.scale_factor(), config_.latent_channels);
  }
  io::VaeConfig config_;
  flux::LatentGeometry geometry_;
};

TEST_P(VaePipelineTailParity, VaeInputFromFinalLatents) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  test::CaseTensors ref(c.file);
  at::Tensor got = vae_input_from_packed(ref.get("latents_final"), geometry_, config_);
  expect_close(test::case_label(c) + " vae_input", got, ref.get("vae_input"), test::kTolFp32);
}

TEST_P(VaePipelineTailParity, DecodedImageFromVaeInput) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  test::CaseTensors ref(c.file);
  at::Tensor got = decoder_of(c)->forward(test::on_test_device(ref.get("vae_input")));
  expect_close(test::case_label(c) + " decoded_image", got, ref.get("decoded_image"), test::kTolFp32);
}

TEST_P(VaePipelineTailParity, Uint8ImageAndPngFromDecodedImage) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  test::CaseTensors ref(c.file);
  std::vector<io::RgbImage> images = to_rgb_images(ref.get("decoded_image"));
  at::Tensor ref_uint8 = ref.get("image_uint8").contiguous();  // [n, H, W, 3]
  ASSERT_EQ(static_cast<int64_t>(images.size()), ref_uint8.size(0));
  ASSERT_EQ(ref_uint8.size(1), geometry_.height) << "reference image height vs the floored call height";
  ASSERT_EQ(ref_uint8.size(2), geometry_.width) << "reference image width vs the floored call width";
  ASSERT_TRUE(c.json.contains("png")) << test::case_label(c) << ": the manifest lists no reference PNG";
  const auto& pngs = c.json["png"];
  ASSERT_EQ(pngs.size(), images.size()) << test::case_label(c) << ": one reference PNG per image";
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string label = str_cat(test::case_label(c), " image ", i);
    at::Tensor r = ref_uint8[static_cast<int64_t>(i)].contiguous();
    expect_pixels_close(label + " vs image_uint8", images[i], r.data_ptr<uint8_t>(), r.size(0), r.size(1));
    const std::string png_path = (std::filesystem::path(test::fixture_root()) / pngs[i].get<std::string>()).string();
    io::RgbImage png = io::read_png(png_path);
    expect_pixels_close(label + " vs " + pngs[i].get<std::string>(), images[i], png.pixels.data(), png.height,
                        png.width);
  }
}

// The whole tail through the one convenience call, per image, from the final packed latents.
TEST_P(VaePipelineTailParity, DecodeImageEndToEndMatchesPng) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  test::CaseTensors ref(c.file);
  at::Tensor latents = ref.get("latents_final");  // [n, L, 64]
  ASSERT_TRUE(c.json.contains("png")) << test::case_label(c) << ": the manifest lists no reference PNG";
  const auto& pngs = c.json["png"];
  ASSERT_EQ(static_cast<int64_t>(pngs.size()), latents.size(0));
  for (bool opt_in : {false, true}) {
    const OptInKernels kernels(opt_in);
    for (int64_t i = 0; i < latents.size(0); ++i) {
      io::RgbImage image = decode_image(decoder_of(c), test::on_test_device(latents[i]), geometry_, config_);
      const std::string png = pngs[static_cast<size_t>(i)].get<std::string>();
      io::RgbImage expected = io::read_png((std::filesystem::path(test::fixture_root()) / png).string());
      expect_pixels_close(str_cat(test::case_label(c), " decode_image(latents_final[", i, "]) vs ", png,
                                  opt_in ? " (Winograd, group_norm_nhwc)" : ""),
                          image, expected.pixels.data(), expected.height, expected.width);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VaePipelineTailParity, testing::ValuesIn(test::cases_of_kind("pipeline")),
                         test::case_test_name);

}  // namespace
}  // namespace fluxmpi::vae
