#pragma once
// One FluxPipeline case run in one process and checked stage by stage against diffusers: token
// ids, embeddings, initial noise (bit for bit), the noise prediction and latents after every step
// and the final latents (kTolPipelineFp32 = 1e-4 relative), and the image (every pixel within +-1
// of the reference PNG, at least 99 % identical). The same code path as the `fluxmpi` command
// (pipeline/text_stage, pipeline/noise, pipeline/denoise, vae/decode_image). Shared by the
// pipeline parity test (diffusers folders) and the single-file parity test.

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include "parallel/partition.h"
#include "io/model_dir.h"
#include "io/png.h"
#include "models/flux/latents.h"
#include "models/flux/transformer.h"
#include "models/vae/image_processor.h"
#include "models/vae/vae_decoder.h"
#include "pipeline/denoise.h"
#include "pipeline/noise.h"
#include "pipeline/text_stage.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {

using test::close_to;
using test::identical;

class PipelineRecorder : public DenoiseObserver {
 public:
  void on_step(const WorkGroup& g, int64_t step, const at::Tensor& latents, const at::Tensor& v) override {
    for (int64_t j = 0; j < g.count; ++j) {
      latents_[{g.first_image + j, step}] = latents[j].clone();
      v_[{g.first_image + j, step}] = v[j].clone();
    }
  }
  std::map<std::pair<int64_t, int64_t>, at::Tensor> latents_, v_;
};

/// Runs the case `c` (its `call`, its recorded tensors in c.file, its PNGs under `png_root`) with
/// the weights of `dir` and checks every stage.
inline void check_pipeline_run(const io::ModelDir& dir, const test::CaseRef& c, const std::string& png_root) {
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const auto& call = c.json["call"];
  const std::string where = test::case_label(c) + ": ";
  const std::string prompt = call["prompt"].get<std::string>();
  const std::string prompt_2 = call.value("prompt_2", nlohmann::json()).is_string() ? call["prompt_2"].get<std::string>() : "";
  const int64_t msl = call.value("max_sequence_length", int64_t{512});
  const int64_t steps = call["num_inference_steps"].get<int64_t>();
  const io::TransformerConfig& tc = dir.transformer_config();
  const flux::LatentGeometry g = flux::latent_geometry(call["height"].get<int64_t>(), call["width"].get<int64_t>(),
                                                       dir.vae_config().scale_factor(), tc.latent_channels());
  EXPECT_EQ(g.height, c.json["output_hw"][0].get<int64_t>()) << where << "floored height";
  EXPECT_EQ(g.width, c.json["output_hw"][1].get<int64_t>()) << where << "floored width";
  std::vector<int64_t> seeds;
  if (call["seed"].is_array()) for (const auto& s : call["seed"]) seeds.push_back(s.get<int64_t>());
  else seeds.push_back(call["seed"].get<int64_t>());
  const int64_t n = static_cast<int64_t>(seeds.size());

  // Stage 1.
  PromptEmbedding e;
  {
    TextEncoders encoders(dir, at::kFloat, at::kCPU);
    e = encoders.encode(prompt, prompt_2, msl, "prompt");
  }
  EXPECT_TRUE(identical(where + "clip_input_ids", e.clip_ids, ref.get("clip_input_ids")[0]));
  EXPECT_TRUE(identical(where + "t5_input_ids", e.t5_ids, ref.get("t5_input_ids")[0]));
  EXPECT_TRUE(close_to(where + "pooled_prompt_embeds", e.pooled, ref.get("pooled_prompt_embeds")[0], test::kTolPipelineFp32));
  EXPECT_TRUE(close_to(where + "prompt_embeds", e.prompt_embeds, ref.get("prompt_embeds")[0], test::kTolPipelineFp32));

  // Stage 2: every image is its own work group, as the command runs them.
  parallel::PlanRequest request;
  request.transformer = tc;
  parallel::StagePlan plan = parallel::StagePlan::make(request);
  flux::FluxTransformer part = flux::load_flux_transformer(dir, flux::TransformerPart::whole(tc), at::kFloat, at::kCPU);
  DenoiseSetup setup;
  setup.steps = steps;
  setup.text_tokens = msl;
  setup.latent_height = g.latent_height;
  setup.latent_width = g.latent_width;
  RootState root;
  root.schedule = sched::flux_schedule(dir.scheduler_config(), steps, g.tokens());
  if (tc.guidance_embeds) root.guidance = call["guidance_scale"].get<double>();
  for (int64_t i = 0; i < n; ++i) {
    setup.groups.push_back({i, 1, 0});
    GroupInputs in;
    in.latents = initial_latents(seeds[static_cast<size_t>(i)], g, at::kFloat);
    EXPECT_TRUE(identical(where + "latents_initial[" + std::to_string(i) + "]", in.latents[0], ref.get("latents_initial")[i]));
    in.text = e.prompt_embeds.unsqueeze(0);
    in.pooled = e.pooled.unsqueeze(0);
    root.groups.push_back(in);
  }
  PipelineRecorder rec;
  root.observer = &rec;
  denoise(setup, *part, plan, /*rank=*/0, nullptr, &root);
  at::Tensor ref_v = ref.get("noise_pred"), ref_x = ref.get("latents_steps");
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < steps; ++k) {
      const std::string at_step = "[" + std::to_string(k) + ", image " + std::to_string(i) + "]";
      EXPECT_TRUE(close_to(where + "noise_pred" + at_step, rec.v_[{i, k}], ref_v[k][i], test::kTolPipelineFp32));
      EXPECT_TRUE(close_to(where + "latents_steps" + at_step, rec.latents_[{i, k}], ref_x[k][i], test::kTolPipelineFp32));
    }
    EXPECT_TRUE(close_to(where + "latents_final[" + std::to_string(i) + "]", root.groups[static_cast<size_t>(i)].latents[0],
                         ref.get("latents_final")[i], test::kTolPipelineFp32));
  }

  // Stage 3: the PNG of every image.
  vae::VaeDecoder decoder = vae::load_vae_decoder(dir, at::kFloat, at::kCPU);
  for (int64_t i = 0; i < n; ++i) {
    io::RgbImage img = vae::decode_image(decoder, root.groups[static_cast<size_t>(i)].latents, g, dir.vae_config());
    io::RgbImage png = io::read_png(png_root + "/" + c.json["png"][static_cast<size_t>(i)].get<std::string>());
    ASSERT_EQ(img.height, png.height) << where;
    ASSERT_EQ(img.width, png.width) << where;
    int max_diff = 0;
    int64_t same = 0;
    for (size_t p = 0; p < img.pixels.size(); ++p) {
      int d = std::abs(int(img.pixels[p]) - int(png.pixels[p]));
      max_diff = std::max(max_diff, d);
      same += d == 0;
    }
    const double share = static_cast<double>(same) / static_cast<double>(img.pixels.size());
    EXPECT_LE(max_diff, 1) << where << "image " << i << ": max pixel difference " << max_diff << " > 1";
    EXPECT_GE(share, 0.99) << where << "image " << i << ": only " << share * 100 << " % of the values identical";
    if (const char* env = std::getenv("FLUXMPI_PRINT_ERRORS"); env && std::string(env) == "1")
      std::printf("  measured %simage %lld: max pixel diff %d, %.4f %% identical\n", where.c_str(),
                  static_cast<long long>(i), max_diff, share * 100);
  }
}

}  // namespace fluxmpi::pipeline
