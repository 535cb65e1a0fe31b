// FLUX.1 Redux end to end in one process against the redux fixtures (cases of kind
// redux_pipeline): FluxPriorReduxPipeline (the text side from fluxmpi's text encoders or zeros; the
// images through the SigLIP processor, encoder and Redux embedder; scales, concatenation, the sum
// over images; pipeline/redux_stage.h, rank 0's stage) and then FluxPipeline on those embeddings
// with the step loop fluxmpi runs: the
// prior's output, the initial noise (bit for bit), every step's noise prediction and latents, the
// final latents (kTolPipelineFp32 = 1e-4 relative) and the image (every pixel within +-1 of the
// reference PNG, at least 99 % identical).

#include <gtest/gtest.h>

#include <fstream>

#include "io/redux_dir.h"
#include "models/siglip/redux_prior.h"
#include "models/siglip/siglip_processor.h"
#include "pipeline/redux_stage.h"
#include "pipeline_case.h"
#include "support/subtree_cases.h"

namespace fluxmpi::pipeline {
namespace {

using test::SubtreeCase;

std::vector<SubtreeCase> pipeline_cases() {
  return test::project_subtree_cases("redux", [](const std::string& kind) { return kind == "redux_pipeline"; });
}

// The FluxPipeline folder the case's Redux output drives: its pipeline entry's base_pipeline, in
// the shared fixture tree.
std::string base_pipeline_of(const SubtreeCase& c) {
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(c.subtree + "/manifest.json"));
  const std::string pipeline = c.name.substr(0, c.name.find('/'));
  return test::fixture_root() + "/" + m.at("pipelines").at(pipeline).at("base_pipeline").get<std::string>();
}

// A call's scale: one number for every image, or one per image.
std::vector<double> scales_of(const nlohmann::json& v, size_t images) {
  if (v.is_array()) return v.get<std::vector<double>>();
  return std::vector<double>(images, v.get<double>());
}

class ReduxPipelineParity : public testing::TestWithParam<SubtreeCase> {};

TEST_P(ReduxPipelineParity, WholeRunMatchesDiffusers) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "redux");
  FLUXMPI_REQUIRE_FIXTURES();  // the base FluxPipeline lives in the shared tree
  c10::InferenceMode guard;
  const test::CaseTensors ref(c.file);
  const auto& call = c.json.at("call");
  const std::string where = c.name + ": ";
  const io::ModelDir base(base_pipeline_of(c));
  const io::TransformerConfig& tc = base.transformer_config();
  const int64_t msl = call.at("max_sequence_length").get<int64_t>();

  // The prior's text side: the prompt through fluxmpi's encoders, or zeros.
  at::Tensor text = at::zeros({msl, tc.joint_attention_dim}), pooled = at::zeros({tc.pooled_projection_dim});
  if (call.contains("prompt")) {
    TextEncoders encoders(base, at::kFloat, at::kCPU);
    const PromptEmbedding e = encoders.encode(call.at("prompt").get<std::string>(), call.value("prompt_2", std::string()),
                                              msl, "prompt");
    text = e.prompt_embeds;
    pooled = e.pooled;
  }
  test::expect_close(where + "text side prompt_embeds", text, ref.get("in_text_prompt_embeds"), test::kTolPipelineFp32);
  test::expect_close(where + "text side pooled", pooled, ref.get("in_text_pooled"), test::kTolPipelineFp32);

  // The prior's image side (rank 0's Redux stage, one image at a time; the prior runs them as one batch).
  const io::ReduxDir redux(c.model_dir);
  std::vector<io::Image8> images;
  std::vector<at::Tensor> pixels;
  for (const auto& f : call.at("redux_images")) {
    images.push_back(io::read_image(c.subtree + "/" + f.get<std::string>()));
    pixels.push_back(siglip::siglip_preprocess(images.back(), redux.processor_config()).pixel_values);
  }
  test::expect_identical(where + "pixel_values", at::cat(pixels, 0), ref.get("pixel_values"));
  check_redux(redux, tc, "transformer/config.json");
  const at::Tensor image_embeds = ReduxEncoder(redux, at::kFloat, at::kCPU).encode(images);
  test::expect_close(where + "image_embeds", image_embeds, ref.get("image_embeds"), test::kTolFp32);

  // The prior's arithmetic, first on the reference's own inputs, then on ours.
  const size_t n_images = call.at("redux_images").size();
  const std::vector<double> ps = scales_of(call.at("prompt_embeds_scale"), n_images);
  const std::vector<double> qs = scales_of(call.at("pooled_prompt_embeds_scale"), n_images);
  const siglip::ReduxPrompt on_ref =
      siglip::redux_prompt(ref.get("in_text_prompt_embeds"), ref.get("in_text_pooled"), ref.get("image_embeds"), ps, qs);
  test::expect_close(where + "prompt_embeds (prior on the reference inputs)", on_ref.prompt_embeds,
                     ref.get("prompt_embeds")[0], test::kTolFp32);
  test::expect_close(where + "pooled_prompt_embeds (prior on the reference inputs)", on_ref.pooled,
                     ref.get("pooled_prompt_embeds")[0], test::kTolFp32);
  const siglip::ReduxPrompt prior = redux_text(call.contains("prompt") ? text : at::Tensor(),
                                               call.contains("prompt") ? pooled : at::Tensor(), msl, tc, image_embeds, ps, qs);
  test::expect_close(where + "prompt_embeds", prior.prompt_embeds, ref.get("prompt_embeds")[0], test::kTolPipelineFp32);
  test::expect_close(where + "pooled_prompt_embeds", prior.pooled, ref.get("pooled_prompt_embeds")[0],
                     test::kTolPipelineFp32);

  // FluxPipeline on the prior's output: the text stream is S + L tokens long, all with text ids 0.
  const int64_t steps = call.at("num_inference_steps").get<int64_t>();
  const flux::LatentGeometry g = flux::latent_geometry(call.at("height").get<int64_t>(), call.at("width").get<int64_t>(),
                                                       base.vae_config().scale_factor(), tc.latent_channels());
  parallel::PlanRequest request;
  request.transformer = tc;
  const parallel::StagePlan plan = parallel::StagePlan::make(request);
  const flux::FluxTransformer part =
      flux::load_flux_transformer(base, flux::TransformerPart::whole(tc), at::kFloat, at::kCPU);
  DenoiseSetup setup;
  setup.steps = steps;
  setup.text_tokens = prior.prompt_embeds.size(0);
  setup.latent_height = g.latent_height;
  setup.latent_width = g.latent_width;
  setup.groups.push_back({0, 1, 0});
  RootState root;
  root.schedule = sched::flux_schedule(base.scheduler_config(), steps, g.tokens());
  if (tc.guidance_embeds) root.guidance = call.at("guidance_scale").get<double>();
  GroupInputs in;
  in.latents = initial_latents(call.at("seed").get<int64_t>(), g, at::kFloat);
  test::expect_identical(where + "latents_initial", in.latents, ref.get("latents_initial"));
  in.text = prior.prompt_embeds.unsqueeze(0);
  in.pooled = prior.pooled.unsqueeze(0);
  root.groups.push_back(in);
  PipelineRecorder rec;
  root.observer = &rec;
  denoise(setup, *part, plan, /*rank=*/0, nullptr, &root);
  const at::Tensor ref_v = ref.get("noise_pred"), ref_x = ref.get("latents_steps");
  ASSERT_EQ(ref_v.size(0), steps) << where;
  for (int64_t k = 0; k < steps; ++k) {
    const std::string at_step = "[" + std::to_string(k) + "]";
    test::expect_close(where + "noise_pred" + at_step, rec.v_[{0, k}], ref_v[k], test::kTolPipelineFp32);
    test::expect_close(where + "latents_steps" + at_step, rec.latents_[{0, k}], ref_x[k], test::kTolPipelineFp32);
  }
  for (const char* name : {"noise_pred", "latents_final"}) {
    const double d = c.json.at("tensors").at(name).at("f64_relative").get<double>();
    EXPECT_LT(d, test::kTolPipelineFp32) << where << "the reference " << name << " is " << d << " from float64";
  }
  test::expect_close(where + "latents_final", root.groups[0].latents, ref.get("latents_final"), test::kTolPipelineFp32);

  // The image.
  const vae::VaeDecoder decoder = vae::load_vae_decoder(base, at::kFloat, at::kCPU);
  const io::RgbImage img = vae::decode_image(decoder, root.groups[0].latents, g, base.vae_config());
  const io::RgbImage png = io::read_png(c.subtree + "/" + c.json.at("png").at(0).get<std::string>());
  ASSERT_EQ(img.height, png.height) << where;
  ASSERT_EQ(img.width, png.width) << where;
  int max_diff = 0;
  int64_t same = 0;
  for (size_t p = 0; p < img.pixels.size(); ++p) {
    const int d = std::abs(int(img.pixels[p]) - int(png.pixels[p]));
    max_diff = std::max(max_diff, d);
    same += d == 0;
  }
  const double share = static_cast<double>(same) / static_cast<double>(img.pixels.size());
  EXPECT_LE(max_diff, 1) << where << "max pixel difference " << max_diff << " > 1";
  EXPECT_GE(share, 0.99) << where << "only " << share * 100 << " % of the values identical";
  std::printf("[ measured ] %simage: max pixel diff %d, %.4f %% identical\n", where.c_str(), max_diff, share * 100);
}

INSTANTIATE_TEST_SUITE_P(Redux, ReduxPipelineParity, testing::ValuesIn(pipeline_cases()), test::image_case_name);

}  // namespace
}  // namespace fluxmpi::pipeline
