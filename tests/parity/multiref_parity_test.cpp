// FLUX.2 multi-reference editing against diffusers 0.40 (tests/fixtures/flux2-multiref, made by
// tools/fixtures/flux2_multiref.py with Flux2Pipeline / Flux2KleinPipeline(image=[...])):
//  - the FLUX.2 VAE encoder (flux2::VaeEncoder): every input reference preprocessed as diffusers
//    does (bit for bit), its latent mode and its normalised patchified latents, at kTolFp32;
//  - whole runs in process: the references' tokens (encode_references) at kTolFp32, then the step
//    loop (pipeline::denoise on one rank) with the tokens appended to the image tokens, every step's
//    latents and noise prediction at kTolPipelineFp32, from the prompt embeddings the call was
//    given (the shared flux2 case the manifest names). The command line's run, text encoder
//    included: tests/mpi/jobs_flux2_multiref_test.cpp.
// Each tolerance lies above the reference's own distance to float64 (checked from the manifest).

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <filesystem>

#include "core/error.h"
#include "io/image_file.h"
#include "io/model_dir.h"
#include "models/flux2/vae_encoder.h"
#include "parallel/partition.h"
#include "pipeline/denoise.h"
#include "pipeline/flux2/references.h"
#include "pipeline/flux2/stages.h"
#include "support/multiref_cases.h"
#include "support/step_loop.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {
namespace fs = std::filesystem;

using test::expect_close;
using test::expect_identical;
using test::kTolFp32;
using test::kTolPipelineFp32;
using test::SubtreeCase;

flux2::VaeEncoder encoder_of(const SubtreeCase& c) {
  return flux2::load_vae_encoder(test::multiref_pipeline_dir(c) + "/vae", at::kFloat, at::kCPU);
}

class Flux2VaeEncoder : public testing::TestWithParam<SubtreeCase> {};

TEST_P(Flux2VaeEncoder, MatchesDiffusers) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, test::kMultirefSubtree);
  ASSERT_TRUE(test::tolerance_above_reference_error(c, kTolFp32));
  c10::InferenceMode guard;
  const test::CaseTensors ref(c.file);
  flux2::VaeEncoder encoder = encoder_of(c);
  const int64_t unit = 2 * encoder.config().scale_factor();
  const std::vector<std::string> images = test::multiref_images(c);
  for (size_t k = 0; k < images.size(); ++k) {
    const std::string where = str_cat(c.name, " ", fs::path(images[k]).filename().string(), ": ");
    const at::Tensor x = preprocess_reference(io::read_image(images[k]), unit);
    if (ref.has(str_cat("preprocessed_", k))) expect_identical(where + "preprocessed", x, ref.get(str_cat("preprocessed_", k)));
    vae::LatentDistribution dist = encoder.encoder()->encode(x);
    expect_close(where + "latent mode", dist.mode(), ref.get(str_cat("latent_mode_", k)), kTolFp32);
    expect_close(where + "image_latents", encoder.encode(x), ref.get(str_cat("image_latents_", k)), kTolFp32);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Flux2VaeEncoder, testing::ValuesIn(test::multiref_cases("vae_encode")),
                         test::image_case_name);

// The prompt embeddings the call was given: a row of a shared flux2 case.
at::Tensor shared_embeds(const SubtreeCase& c, const char* name) {
  const auto& src = c.json.at("prompt_embeds_source");
  const test::CaseTensors t((fs::path(test::fixture_root()) / src.at("file").get<std::string>()).string());
  const int64_t row = src.at("row").get<int64_t>();
  return t.get(name).narrow(0, row, 1).clone();
}

class Flux2MultirefPipeline : public testing::TestWithParam<SubtreeCase> {};

TEST_P(Flux2MultirefPipeline, StepLoopMatchesDiffusers) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, test::kMultirefSubtree);
  ASSERT_TRUE(test::tolerance_above_reference_error(c, kTolPipelineFp32));
  ASSERT_LT(c.json.at("tensors").at("image_latents").value("f64_distance", 0.0), kTolFp32) << c.name;
  c10::InferenceMode guard;
  const test::CaseTensors ref(c.file);
  const io::ModelDir model(test::multiref_pipeline_dir(c));
  const std::string where = c.name + ": ";

  // The references' tokens, as rank 0's stage 1 makes them.
  std::vector<io::Image8> images;
  for (const std::string& p : test::multiref_images(c)) images.push_back(io::read_image(p));
  const flux2::VaeEncoder encoder = encoder_of(c);
  const int64_t scale = encoder.config().scale_factor();
  const at::Tensor tokens = encode_references(images, encoder, 2 * scale, at::kFloat, {});
  expect_close(where + "image_latents", tokens, ref.get("image_latents"), kTolFp32);

  // One rank, the whole transformer.
  const io::Flux2TransformerConfig& tc = model.flux2_transformer_config();
  parallel::PlanRequest request;
  request.transformer = io::transformer_shape(tc);
  request.family = parallel::flux2_family_costs(tc);
  const parallel::StagePlan plan = parallel::StagePlan::make(request);
  const std::shared_ptr<flux::StageModel> part =
      load_flux2_stage(model, 0, tc.num_blocks(), true, true, at::kFloat, at::kCPU, nullptr);

  const auto& call = c.json.at("call");
  const bool cfg = c.json.at("true_cfg").get<bool>();
  DenoiseSetup setup;
  setup.steps = call.at("steps").get<int64_t>();
  const at::Tensor text = shared_embeds(c, "prompt_embeds");
  setup.text_tokens = text.size(1);
  setup.latent_height = c.json.at("output_hw").at(0).get<int64_t>() / scale;
  setup.latent_width = c.json.at("output_hw").at(1).get<int64_t>() / scale;
  for (const auto& hw : c.json.at("reference_hw"))
    setup.references.push_back({hw.at(0).get<int64_t>() / scale, hw.at(1).get<int64_t>() / scale});
  setup.passes = cfg ? 2 : 1;
  setup.groups = {WorkGroup{0, 1, 0}};
  ASSERT_EQ(setup.reference_tokens(), tokens.size(1));

  RootState root;
  root.schedule = flux2_run_schedule(model, setup.steps, setup.image_tokens());
  if (model.flux2_kind() == io::Flux2Kind::Dev) root.guidance = call.at("guidance").get<double>();
  root.true_cfg_scale = call.at("guidance").get<double>();
  GroupInputs in;
  in.latents = ref.get("latents_initial");
  in.text = text;
  if (cfg) in.neg_text = shared_embeds(c, "negative_prompt_embeds");
  in.reference = tokens;
  root.groups = {in};
  test::StepRecorder steps;
  root.observer = &steps;
  denoise(setup, *part, plan, 0, nullptr, &root);

  const at::Tensor x = ref.get("latents_steps"), v = ref.get("noise_pred_steps");
  for (int64_t k = 0; k < setup.steps; ++k) {
    expect_close(str_cat(where, "noise_pred of step ", k), steps.vs.at({0, k}), v[k], kTolPipelineFp32);
    expect_close(str_cat(where, "latents after step ", k), steps.x.at({0, k}), x[k], kTolPipelineFp32);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Flux2MultirefPipeline, testing::ValuesIn(test::multiref_cases("pipeline")),
                         test::image_case_name);

}  // namespace
}  // namespace fluxmpi::pipeline
