// The transformer with LoRAs merged, in one process, against diffusers, for every case of
// ../shared/fixtures/lora/manifest.json: from the reference's prompt embeddings and initial noise,
// the noise prediction and the latents after every step and the final latents are within
// kTolPipelineFp32 (1e-4 relative) of diffusers' (load_lora_weights + fuse_lora, then the pipeline).
// The LoRAs go through what every rank runs: io::LoraFile, flux_lora_set and the loader hook.
// (tests/mpi/jobs_lora_test.cpp runs the same cases through the command line on 1-3 ranks.)

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <fstream>

#include "io/model_dir.h"
#include "models/flux/latents.h"
#include "models/flux/lora_targets.h"
#include "models/flux/transformer.h"
#include "parallel/partition.h"
#include "pipeline/denoise.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {
namespace fs = std::filesystem;

std::string lora_root() { return test::fixture_root() + "/lora"; }

std::vector<test::CaseRef> lora_cases() {
  std::vector<test::CaseRef> out;
  std::ifstream in(lora_root() + "/manifest.json");
  if (!in) return {test::CaseRef{}};
  const nlohmann::json m = nlohmann::json::parse(in);
  for (auto it = m["pipelines"].begin(); it != m["pipelines"].end(); ++it)
    for (const auto& c : it.value()["cases"]) {
      test::CaseRef r;
      r.pipeline = it.key();
      r.name = c["name"].get<std::string>();
      r.file = lora_root() + "/" + c["file"].get<std::string>();
      r.model_dir = (fs::path(lora_root()) / it.value()["path"].get<std::string>()).lexically_normal().string();
      r.json = c;
      out.push_back(std::move(r));
    }
  if (out.empty()) out.push_back(test::CaseRef{});
  return out;
}

class Recorder : public DenoiseObserver {
 public:
  void on_step(const WorkGroup&, int64_t step, const at::Tensor& latents, const at::Tensor& v) override {
    latents_[step] = latents[0].clone();
    v_[step] = v[0].clone();
  }
  std::map<int64_t, at::Tensor> latents_, v_;
};

class LoraParity : public testing::TestWithParam<test::CaseRef> {};

TEST_P(LoraParity, MergedTransformerMatchesDiffusers) {
  const test::CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_FIXTURES();
  if (c.pipeline.empty()) {
    const std::string why = "LoRA fixtures not found: no '" + lora_root() + "/manifest.json'";
    if (test::running_in_ci()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  io::ModelDir dir(c.model_dir);
  const io::TransformerConfig& tc = dir.transformer_config();
  const auto& call = c.json["call"];
  const std::string where = test::case_label(c) + ": ";
  const int64_t steps = call["num_inference_steps"].get<int64_t>();
  const flux::LatentGeometry g = flux::latent_geometry(call["height"].get<int64_t>(), call["width"].get<int64_t>(),
                                                       dir.vae_config().scale_factor(), tc.latent_channels());

  std::vector<std::shared_ptr<const io::LoraFile>> loras;
  for (const auto& l : c.json["loras"])
    loras.push_back(std::make_shared<const io::LoraFile>(
        io::LoraSpec{lora_root() + "/" + l["file"].get<std::string>(), l["scale"].get<double>()}));
  auto applied = std::make_shared<std::vector<int64_t>>();
  flux::FluxTransformer part = flux::load_flux_transformer(dir, flux::TransformerPart::whole(tc), at::kFloat, at::kCPU,
                                                           nullptr, flux::flux_lora_set(loras, tc).adjust(applied));
  for (size_t f = 0; f < loras.size(); ++f)
    EXPECT_GT((*applied)[f], 0) << where << "LoRA " << f << " changed no weight";

  parallel::PlanRequest request;
  request.transformer = tc;
  parallel::StagePlan plan = parallel::StagePlan::make(request);
  DenoiseSetup setup;
  setup.steps = steps;
  setup.text_tokens = ref.get("prompt_embeds").size(1);
  setup.latent_height = g.latent_height;
  setup.latent_width = g.latent_width;
  setup.groups.push_back({0, 1, 0});
  RootState root;
  root.schedule = sched::flux_schedule(dir.scheduler_config(), steps, g.tokens());
  if (tc.guidance_embeds) root.guidance = call["guidance_scale"].get<double>();
  GroupInputs in;
  in.latents = ref.get("latents_initial")[0].unsqueeze(0);
  in.text = ref.get("prompt_embeds")[0].unsqueeze(0);
  in.pooled = ref.get("pooled_prompt_embeds")[0].unsqueeze(0);
  root.groups.push_back(in);
  Recorder rec;
  root.observer = &rec;
  denoise(setup, *part, plan, /*rank=*/0, nullptr, &root);
  const at::Tensor ref_v = ref.get("noise_pred"), ref_x = ref.get("latents_steps");
  for (int64_t k = 0; k < steps; ++k) {
    const std::string at_step = "[" + std::to_string(k) + "]";
    EXPECT_TRUE(test::close_to(where + "noise_pred" + at_step, rec.v_[k], ref_v[k][0], test::kTolPipelineFp32));
    EXPECT_TRUE(test::close_to(where + "latents_steps" + at_step, rec.latents_[k], ref_x[k][0], test::kTolPipelineFp32));
  }
  EXPECT_TRUE(test::close_to(where + "latents_final", root.groups[0].latents[0], ref.get("latents_final")[0],
                             test::kTolPipelineFp32));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraParity, testing::ValuesIn(lora_cases()), test::case_test_name);

}  // namespace
}  // namespace fluxmpi::pipeline
