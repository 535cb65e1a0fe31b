// Parity of the image-conditioned pipelines' preparation (pipeline/image_conditioning.h) with
// diffusers 0.40's FluxImg2ImgPipeline, FluxInpaintPipeline, FluxFillPipeline and
// FluxControlPipeline, for every img2img, inpaint, fill and control case of
// ../shared/fixtures/image-inputs, fp32 on the CPU:
//   - the schedule cut (t_start, the timesteps that run) bit for bit;
//   - the preprocessed image, control image and mask bit for bit (Pillow-exact resizing, the
//     same float32 arithmetic);
//   - the latents the first step starts from (latents_initial, through the VAE encoder and
//     scale_noise), the image latents, Fill's masked-image latents and Control's control latents
//     at kTolPipelineFp32 (a VAE-encoder output, as check-cli-extra.sh holds it);
//   - the draws that follow a VAE sample (noise_packed) and the masks (mask_packed: inpaint's
//     nearest 8x8 cell, Fill's 256 pixel features) bit for bit;
//   - inpaint's per-step blend from the reference's own raw step outputs (latents_step_raw ->
//     latents_steps) at kTolFp32.

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "io/image_file.h"
#include "io/model_dir.h"
#include "models/flux/latents.h"
#include "models/vae/vae_encoder.h"
#include "pipeline/image_conditioning.h"
#include "pipeline/image_mode.h"
#include "pipeline/kontext.h"
#include "sched/flow_match_euler.h"
#include "support/fixtures.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {
namespace fs = std::filesystem;
using test::expect_close;
using test::expect_identical;
using test::ImageCase;

std::vector<ImageCase> conditioned_cases() {
  return test::image_cases([](const std::string& kind) {
    return kind == "img2img" || kind == "inpaint" || kind == "fill" || kind == "control";
  });
}

PipelineMode mode_of(const std::string& kind) {
  auto m = parse_mode_name(kind);
  if (!m) throw std::runtime_error("no mode '" + kind + "'");
  return *m;
}

io::Image8 input(const nlohmann::json& call, const char* key) {
  if (!call.contains(key)) return {};
  return io::read_image((fs::path(test::image_inputs_subtree()) / call.at(key).get<std::string>()).string());
}

struct Prepared {
  io::ModelDir dir;
  flux::LatentGeometry geometry;
  sched::Schedule full;
  ConditionInputs inputs;
};

Prepared prepare(const ImageCase& c) {
  const nlohmann::json& call = c.json.at("call");
  Prepared p{io::ModelDir(c.model_dir), {}, {}, {}};
  const auto hw = c.json.at("output_hw");
  p.geometry = flux::latent_geometry(hw[0].get<int64_t>(), hw[1].get<int64_t>(), p.dir.vae_config().scale_factor(),
                                     p.dir.transformer_config().latent_channels());
  const int64_t n = call.at("num_inference_steps").get<int64_t>();
  p.full = sched::flux_schedule(p.dir.scheduler_config(), n, p.geometry.tokens());
  p.inputs.mode = mode_of(c.kind);
  p.inputs.image = input(call, "image");
  p.inputs.mask = input(call, "mask_image");
  p.inputs.control = input(call, "control_image");
  p.inputs.seed = call.at("seed").get<int64_t>();
  if (uses_strength(p.inputs.mode))
    p.inputs.t_start = strength_start_step(n, call.value("strength", 1.0));
  return p;
}

vae::VaeEncoder& encoder_of(const io::ModelDir& dir) {
  static std::map<std::string, vae::VaeEncoder> cache;
  auto it = cache.find(dir.root());
  if (it == cache.end()) it = cache.emplace(dir.root(), vae::load_vae_encoder(dir, at::kFloat, at::kCPU)).first;
  return it->second;
}

class ImageInputsParity : public testing::TestWithParam<ImageCase> {};

TEST_P(ImageInputsParity, ScheduleCutMatchesDiffusers) {
  const ImageCase& c = GetParam();
  REQUIRE_IMAGE_CASE(c);
  test::CaseTensors ref(c.file);
  const Prepared p = prepare(c);
  if (c.json.contains("t_start") && !c.json.at("t_start").is_null()) EXPECT_EQ(p.inputs.t_start, c.json.at("t_start").get<int64_t>()) << c.name;
  const sched::Schedule cut = cut_schedule(p.full, p.inputs.t_start);
  expect_identical(c.name + " timesteps", at::tensor(cut.timesteps), ref.get("timesteps"));
  expect_identical(c.name + " sigmas", at::tensor(p.full.sigmas), ref.get("sigmas"));
}

TEST_P(ImageInputsParity, PreprocessingIsBitExact) {
  const ImageCase& c = GetParam();
  REQUIRE_IMAGE_CASE(c);
  test::CaseTensors ref(c.file);
  const Prepared p = prepare(c);
  if (ref.has("image_preprocessed"))
    expect_identical(c.name + " image_preprocessed", preprocess_image(p.inputs.image, p.geometry), ref.get("image_preprocessed"));
  if (ref.has("control_image_preprocessed"))
    expect_identical(c.name + " control_image_preprocessed", preprocess_image(p.inputs.control, p.geometry),
                     ref.get("control_image_preprocessed"));
  if (ref.has("mask_processed"))
    expect_identical(c.name + " mask_processed", preprocess_mask(p.inputs.mask, p.geometry), ref.get("mask_processed"));
}

TEST_P(ImageInputsParity, ConditioningMatchesDiffusers) {
  const ImageCase& c = GetParam();
  REQUIRE_IMAGE_CASE(c);
  test::CaseTensors ref(c.file);
  const Prepared p = prepare(c);
  const Conditioning got = condition_image(p.inputs, encoder_of(p.dir), p.geometry, p.full, at::kFloat, {});
  expect_close(c.name + " latents_initial", got.initial, ref.get("latents_initial"), test::kTolPipelineFp32);
  const int64_t d = p.geometry.token_dim();
  switch (p.inputs.mode) {
    case PipelineMode::Img2Img:
      expect_close(c.name + " image_latents_packed", got.stored, ref.get("image_latents_packed"), test::kTolPipelineFp32);
      break;
    case PipelineMode::Inpaint:
      expect_close(c.name + " image_latents_packed", got.image_latents, ref.get("image_latents_packed"),
                   test::kTolPipelineFp32);
      expect_identical(c.name + " noise_packed", got.noise, ref.get("noise_packed"));
      expect_identical(c.name + " mask_packed", got.mask, ref.get("mask_packed"));
      break;
    case PipelineMode::Fill:
      expect_close(c.name + " masked_image_latents_packed", got.features.narrow(2, 0, d),
                   ref.get("masked_image_latents_packed"), test::kTolPipelineFp32);
      expect_identical(c.name + " mask_packed", got.features.narrow(2, d, 4 * d), ref.get("mask_packed"));
      expect_close(c.name + " transformer_input_step0[..., 64:]", got.features,
                   ref.get("transformer_input_step0").narrow(2, d, 5 * d), test::kTolPipelineFp32);
      break;
    case PipelineMode::Control:
      expect_close(c.name + " control_latents_packed", got.features, ref.get("control_latents_packed"),
                   test::kTolPipelineFp32);
      expect_close(c.name + " transformer_input_step0[..., 64:]", got.features,
                   ref.get("transformer_input_step0").narrow(2, d, d), test::kTolPipelineFp32);
      break;
    default:
      FAIL() << c.name << ": unexpected mode";
  }
}

TEST_P(ImageInputsParity, InpaintBlendMatchesDiffusers) {
  const ImageCase& c = GetParam();
  REQUIRE_IMAGE_CASE(c);
  if (c.kind != "inpaint") GTEST_SKIP() << c.name << ": no per-step blend (" << c.kind << ")";
  test::CaseTensors ref(c.file);
  const Prepared p = prepare(c);
  const sched::Schedule cut = cut_schedule(p.full, p.inputs.t_start);
  const at::Tensor raw = ref.get("latents_step_raw"), want = ref.get("latents_steps");
  ASSERT_EQ(raw.size(0), cut.num_steps()) << c.name;
  for (int64_t k = 0; k < cut.num_steps(); ++k) {
    const at::Tensor blended = inpaint_blend(raw[k], ref.get("image_latents_packed"), ref.get("noise_packed"),
                                             ref.get("mask_packed"), cut, k);
    expect_close(str_cat(c.name, " latents_steps[", k, "] from latents_step_raw"), blended, want[k], test::kTolFp32);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ImageInputsParity, testing::ValuesIn(conditioned_cases()), test::image_case_name);

// ---------------------------------------------------------------------------------------------
// Kontext: the output size, the reference's size, ids and tokens (VAE mode, no draw), the noise.

class KontextParity : public testing::TestWithParam<ImageCase> {};

TEST_P(KontextParity, SizesIdsAndReferenceMatchDiffusers) {
  const ImageCase& c = GetParam();
  REQUIRE_IMAGE_CASE(c);
  test::CaseTensors ref(c.file);
  const nlohmann::json& call = c.json.at("call");
  const nlohmann::json& k = c.json.at("kontext");
  io::ModelDir dir(c.model_dir);
  const int64_t unit = 2 * dir.vae_config().scale_factor();
  auto opt = [&](const char* key) {
    return call.contains(key) ? std::optional<int64_t>(call.at(key).get<int64_t>()) : std::nullopt;
  };
  const PixelSize out = kontext_output_size(opt("height"), opt("width"), k.at("max_area").get<int64_t>(), unit);
  EXPECT_EQ(out.height, c.json.at("output_hw")[0].get<int64_t>()) << c.name;
  EXPECT_EQ(out.width, c.json.at("output_hw")[1].get<int64_t>()) << c.name;
  if (!call.contains("image")) {
    EXPECT_FALSE(ref.has("image_latents_packed")) << c.name;
    return;
  }
  const io::Image8 image = input(call, "image");
  const PixelSize cond = kontext_condition_size(image.height, image.width, k.at("auto_resize").get<bool>(), unit);
  const auto& resized = c.json.at("input_images").at("image").at("resized_to_hw");
  EXPECT_EQ(cond.height, resized[0].get<int64_t>()) << c.name;
  EXPECT_EQ(cond.width, resized[1].get<int64_t>()) << c.name;
  const int64_t f = dir.vae_config().scale_factor();
  expect_identical(c.name + " image_ids", flux::reference_position_ids(cond.height / f, cond.width / f), ref.get("image_ids"));
  const at::Tensor tokens = kontext_reference(image, cond, encoder_of(dir), at::kFloat, {});
  // kontext_a's reference is a 832x1248 encode made on diffusers' channels-last input, where torch's
  // CPU GroupNorm sums in float32: it is 2.6e-3 from a float64 encode, ours (NCHW) 1.9e-6, so that
  // case holds the encoder test's bound for it (tests/parity/vae_encoder_parity_test.cpp reproduces
  // the reference from that layout); the others hold kTolPipelineFp32.
  const double tol = cond.height * cond.width > 512 * 512 ? 1e-2 : test::kTolPipelineFp32;
  expect_close(c.name + " image_latents_packed", tokens, ref.get("image_latents_packed"), tol);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KontextParity,
                         testing::ValuesIn(test::image_cases([](const std::string& kind) { return kind == "kontext"; })),
                         test::image_case_name);

}  // namespace
}  // namespace fluxmpi::pipeline
