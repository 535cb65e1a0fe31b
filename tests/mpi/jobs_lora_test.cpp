// `mpirun -np P fluxmpi --lora FILE:SCALE ...` on every case of ../shared/fixtures/lora/manifest.json
// (a diffusers/PEFT LoRA at 1.0, a kohya LoRA at 0.8 with fused q|k|v and q|k|v|mlp, both stacked at
// 0.5 and 1.0), through the command line and the checkpoint: on 1, 2 and 3 ranks the noise
// prediction and latents of every step (latents/noise_pred, latents/steps) and the final latents
// match diffusers' within kTolPipelineFp32 (1e-4 relative), the PNG is within +-1 of the reference
// with >= 99 % of the values identical, and the rows and pixels are bit-identical across the rank
// counts (threads pinned to 1 per rank). The 3-rank split cuts inside the double blocks, so each
// rank merges only the LoRA updates of its own slice.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_reader.h"
#include "io/model_dir.h"
#include "io/png.h"
#include "job_runner.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace {
namespace fs = std::filesystem;

std::string lora_root() { return fixture_root() + "/lora"; }

// The cases of the lora subtree's manifest (the same case format as the top-level manifest, plus
// "loras"); one placeholder without the subtree.
std::vector<CaseRef> lora_cases() {
  std::vector<CaseRef> out;
  std::ifstream in(lora_root() + "/manifest.json");
  if (!in) return {CaseRef{}};
  const nlohmann::json m = nlohmann::json::parse(in);
  for (auto it = m["pipelines"].begin(); it != m["pipelines"].end(); ++it) {
    for (const auto& c : it.value()["cases"]) {
      CaseRef r;
      r.pipeline = it.key();
      r.name = c["name"].get<std::string>();
      r.kind = c.value("kind", "");
      r.file = lora_root() + "/" + c["file"].get<std::string>();
      r.model_dir = (fs::path(lora_root()) / it.value()["path"].get<std::string>()).lexically_normal().string();
      r.json = c;
      r.pipeline_json = it.value();
      out.push_back(std::move(r));
    }
  }
  if (out.empty()) out.push_back(CaseRef{});
  return out;
}

std::vector<std::string> case_args(const CaseRef& c) {
  const auto& a = c.json["call"];
  std::vector<std::string> out = {"--model", c.model_dir, "--prompt", a["prompt"].get<std::string>(), "--dtype", "fp32",
                                  "--no-progress", "--height", std::to_string(a["height"].get<int64_t>()), "--width",
                                  std::to_string(a["width"].get<int64_t>()), "--steps",
                                  std::to_string(a["num_inference_steps"].get<int64_t>()), "--guidance",
                                  std::to_string(a["guidance_scale"].get<double>()), "--seed",
                                  std::to_string(a["seed"].get<int64_t>())};
  if (a.contains("max_sequence_length"))
    out.insert(out.end(), {"--max-sequence-length", std::to_string(a["max_sequence_length"].get<int64_t>())});
  for (const auto& l : c.json["loras"]) {
    char scale[32];
    std::snprintf(scale, sizeof scale, "%.17g", l["scale"].get<double>());
    out.insert(out.end(), {"--lora", lora_root() + "/" + l["file"].get<std::string>() + ":" + scale});
  }
  return out;
}

class LoraJobs : public testing::TestWithParam<CaseRef> {};

TEST_P(LoraJobs, MatchDiffusersOnOneTwoAndThreeRanksBitIdentically) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_FIXTURES();
  if (c.pipeline.empty()) {
    const std::string why = "LoRA fixtures not found: no '" + lora_root() + "/manifest.json'";
    if (running_in_ci()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  TempDir dir("lora-" + case_test_name(testing::TestParamInfo<CaseRef>(c, 0)));
  CaseTensors ref(c.file);
  const std::string png_ref = lora_root() + "/" + c.json["png"][0].get<std::string>();
  const int64_t steps = c.json["call"]["num_inference_steps"].get<int64_t>();
  // P = 2 cuts at the planner's split, P = 3 at 0:0, 1:1, 2:rest (inside the double blocks).
  const std::vector<std::pair<int, std::string>> runs = {{1, ""}, {2, ""}, {3, "0:0-0,1:1-1,2:2-"}};
  at::Tensor rows_p1, pixels_p1;
  for (const auto& [ranks, partition_head] : runs) {
    const std::string tag = "p" + std::to_string(ranks);
    auto args = case_args(c);
    args.insert(args.end(), {"--checkpoint", dir / (tag + ".h5"), "-o", dir / (tag + ".png")});
    if (!partition_head.empty()) {
      io::ModelDir model(c.model_dir);
      const int64_t B = model.transformer_config().num_blocks();
      args.insert(args.end(), {"--partition", partition_head + std::to_string(B - 1)});
    }
    JobResult r = run_fluxmpi(ranks, args);
    ASSERT_EQ(r.exit_code, 0) << tag << ":\n" << r.output;
    const std::string what = case_label(c) + " on " + std::to_string(ranks) + " rank(s): ";

    ckpt::CheckpointReader ck = ckpt::CheckpointReader::open(dir / (tag + ".h5"));
    ASSERT_EQ(ck.attributes(0).loras.size(), c.json["loras"].size()) << what << "LoRAs stored in the checkpoint";
    const at::Tensor v = ck.dataset(0, "latents/noise_pred"), x = ck.dataset(0, "latents/steps");
    ASSERT_EQ(x.size(0), steps) << what << "rows of latents/steps";
    const at::Tensor ref_v = ref.get("noise_pred"), ref_x = ref.get("latents_steps");
    for (int64_t k = 0; k < steps; ++k) {
      const std::string at_step = "[" + std::to_string(k) + "]";
      EXPECT_TRUE(close_to(what + "noise_pred" + at_step, v[k], ref_v[k][0], kTolPipelineFp32));
      EXPECT_TRUE(close_to(what + "latents_steps" + at_step, x[k], ref_x[k][0], kTolPipelineFp32));
    }
    EXPECT_TRUE(close_to(what + "latents_final", x[steps - 1], ref.get("latents_final")[0], kTolPipelineFp32));

    const at::Tensor pixels = png_pixels(dir / (tag + ".png")), expected = png_pixels(png_ref);
    ASSERT_EQ(pixels.sizes(), expected.sizes()) << what << "PNG size";
    const at::Tensor diff = (pixels.to(at::kInt) - expected.to(at::kInt)).abs();
    const int max_diff = diff.max().item<int>();
    const double same = diff.eq(0).to(at::kDouble).mean().item<double>();
    EXPECT_LE(max_diff, 1) << what << "max pixel difference " << max_diff << " > 1";
    EXPECT_GE(same, 0.99) << what << "only " << same * 100 << " % of the pixel values identical";

    if (ranks == 1) {
      rows_p1 = x;
      pixels_p1 = pixels;
    } else {
      EXPECT_TRUE(identical(what + "latents/steps vs 1 rank", x, rows_p1));
      EXPECT_TRUE(identical(what + "PNG pixels vs 1 rank", pixels, pixels_p1));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraJobs, testing::ValuesIn(lora_cases()), case_test_name);

}  // namespace
}  // namespace fluxmpi::test
