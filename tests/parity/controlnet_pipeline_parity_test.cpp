// FluxControlNetPipeline parity with diffusers 0.40 on the pipeline cases of the ControlNet
// fixtures (tests/fixtures/controlnet): the control images' preprocessing (bit-exact), their VAE
// latents and the noise drawn by one generator in diffusers' order, the schedule and
// controlnet_keep, and the whole step loop (pipeline::denoise on one rank with the ControlNets of
// pipeline/control_residuals) from the recorded prompt embeddings and control latents: every
// step's noise prediction and the final latents within kTolPipelineFp32 (1e-4 * max(1, max |ref|)),
// above each reference's recorded distance to float64.

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include "io/image_file.h"
#include "io/model_dir.h"
#include "models/flux/transformer.h"
#include "parallel/partition.h"
#include "pipeline/control_residuals.h"
#include "pipeline/controlnet_inputs.h"
#include "pipeline/denoise.h"
#include "pipeline/image_conditioning.h"
#include "sched/flow_match_euler.h"
#include "support/controlnet_cases.h"
#include "support/step_loop.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

using test::expect_close;
using test::expect_identical;
using test::SubtreeCase;

struct Case {
  io::ModelDir dir;
  nlohmann::json call;
  flux::LatentGeometry geometry;
  std::vector<io::Image8> images;
  std::vector<std::string> nets;  // the ControlNet folder of each run
  std::vector<ControlRun> runs;
  bool pixels = false;
};

Case prepare(const SubtreeCase& c) {
  Case p{io::ModelDir(test::controlnet_base_dir(c)), c.json.at("call"), {}, {}, {}, {}, false};
  const auto hw = c.json.at("output_hw");
  p.geometry = flux::latent_geometry(hw[0].get<int64_t>(), hw[1].get<int64_t>(), p.dir.vae_config().scale_factor(),
                                     p.dir.transformer_config().latent_channels());
  const auto names = p.call.at("nets").get<std::vector<std::string>>();
  const auto images = p.call.at("images").get<std::vector<std::string>>();
  for (size_t k = 0; k < images.size(); ++k) {
    p.images.push_back(io::read_image(test::controlnet_path(c, "inputs/" + images[k])));
    ControlRun run;
    run.net = names.size() == 1 ? 0 : k;  // one net and several images: a Union net run per image
    const auto& mode = p.call.at("modes")[k];
    run.mode = mode.is_null() ? -1 : mode.get<int64_t>();
    run.scale = p.call.at("scales")[k].get<double>();
    run.guidance_start = p.call.at("start")[k].get<double>();
    run.guidance_end = p.call.at("end")[k].get<double>();
    p.runs.push_back(run);
  }
  for (const std::string& n : names) p.nets.push_back(test::controlnet_dir(c, n));
  p.pixels = c.json.at("layout").get<std::string>() == "xlabs";
  return p;
}

class ControlNetPipelineParity : public testing::TestWithParam<SubtreeCase> {};

TEST_P(ControlNetPipelineParity, ControlImagesScheduleAndKeep) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, test::kControlNetSubtree);
  FLUXMPI_REQUIRE_FIXTURES();
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const Case p = prepare(c);
  for (size_t k = 0; k < p.images.size(); ++k)
    expect_identical(c.name + ": control_image_" + std::to_string(k) + "_preprocessed",
                     preprocess_image(p.images[k], p.geometry), ref.get("control_image_" + std::to_string(k) + "_preprocessed"));
  const vae::VaeEncoder encoder = vae::load_vae_encoder(p.dir, at::kFloat, at::kCPU);
  const ControlNetConditioning got =
      controlnet_conditioning(p.images, p.pixels, p.call.at("seed").get<int64_t>(), &encoder, p.geometry, at::kFloat, {});
  for (size_t k = 0; k < got.controls.size() && !p.pixels; ++k) {
    const std::string name = "control_latents_packed_" + std::to_string(k);
    expect_close(c.name + ": " + name, got.controls[k], ref.get(name), test::kTolFp32);
  }
  expect_identical(c.name + ": latents_initial (the generator's draw after the control samples)", got.initial,
                   ref.get("latents_initial"));

  const int64_t steps = p.call.at("steps").get<int64_t>();
  const sched::Schedule s = sched::flux_schedule(p.dir.scheduler_config(), steps, p.geometry.tokens());
  expect_identical(c.name + ": timesteps", at::tensor(s.timesteps), ref.get("timesteps"));
  expect_identical(c.name + ": sigmas", at::tensor(s.sigmas), ref.get("sigmas"));
  std::vector<float> keep;
  for (int64_t i = 0; i < steps; ++i)
    for (const ControlRun& run : p.runs)
      keep.push_back(static_cast<float>(control_keep(i, steps, run.guidance_start, run.guidance_end)));
  expect_identical(c.name + ": controlnet_keep", at::tensor(keep).view({steps, -1}), ref.get("controlnet_keep"));
}

TEST_P(ControlNetPipelineParity, StepLoopFromRecordedInputs) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, test::kControlNetSubtree);
  FLUXMPI_REQUIRE_FIXTURES();
  ASSERT_TRUE(test::tolerance_above_f64(c, test::kTolPipelineFp32));
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const Case p = prepare(c);
  const io::TransformerConfig& tc = p.dir.transformer_config();
  flux::FluxTransformer model =
      flux::load_flux_transformer(p.dir, flux::TransformerPart::whole(tc), at::kFloat, at::kCPU);
  parallel::PlanRequest request;
  request.transformer = tc;
  const parallel::StagePlan plan = parallel::StagePlan::make(request);

  const at::Tensor timesteps = ref.get("timesteps"), sigmas = ref.get("sigmas");
  DenoiseSetup setup;
  setup.steps = timesteps.size(0);
  setup.text_tokens = ref.get("prompt_embeds").size(1);
  setup.latent_height = p.geometry.latent_height;
  setup.latent_width = p.geometry.latent_width;
  setup.passes = ref.has("negative_prompt_embeds") ? 2 : 1;
  setup.groups = {WorkGroup{0, 1, 0}};

  std::vector<flux::FluxControlNet> nets;
  for (const std::string& dir : p.nets) nets.push_back(flux::load_flux_controlnet(dir, at::kFloat, at::kCPU));
  const double guidance = p.call.at("guidance").get<double>();
  ControlResiduals control(std::move(nets), p.runs, setup, guidance);
  setup.control = control_routing(control.layout(), tc, p.runs, setup.steps, setup.patches);
  std::vector<at::Tensor> controls;
  for (size_t k = 0; k < p.runs.size(); ++k)
    controls.push_back(p.pixels ? ref.get("control_image_" + std::to_string(k) + "_preprocessed")
                                : ref.get("control_latents_packed_" + std::to_string(k)));
  control.set_group(0, controls);

  RootState root;
  root.schedule.timesteps = std::vector<float>(timesteps.data_ptr<float>(), timesteps.data_ptr<float>() + setup.steps);
  root.schedule.sigmas = std::vector<float>(sigmas.data_ptr<float>(), sigmas.data_ptr<float>() + setup.steps + 1);
  if (tc.guidance_embeds) root.guidance = guidance;
  root.true_cfg_scale = p.call.value("true_cfg_scale", 1.0);
  GroupInputs in;
  in.latents = ref.get("latents_initial");
  in.text = ref.get("prompt_embeds");
  in.pooled = ref.get("pooled_prompt_embeds");
  if (setup.passes == 2) {
    in.neg_text = ref.get("negative_prompt_embeds");
    in.neg_pooled = ref.get("negative_pooled_prompt_embeds");
  }
  root.groups = {in};
  test::StepRecorder steps;
  root.observer = &steps;
  root.control = &control;
  denoise(setup, *model, plan, 0, nullptr, &root);

  const at::Tensor noise_pred = ref.get("noise_pred");
  for (int64_t k = 0; k < setup.steps; ++k)
    expect_close(c.name + ": noise_pred[" + std::to_string(k) + "]", steps.vs.at({0, k}), noise_pred[k], test::kTolPipelineFp32);
  expect_close(c.name + ": latents_final", root.groups[0].latents, ref.get("latents_final"), test::kTolPipelineFp32);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ControlNetPipelineParity,
                         testing::ValuesIn(test::controlnet_cases("controlnet_pipeline")), test::image_case_name);

}  // namespace
}  // namespace fluxmpi::pipeline
