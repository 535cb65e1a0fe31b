// FLUX.2 multi-reference editing through the command line (docs/flux2.md, "Multi-reference
// editing"): every case of tests/fixtures/flux2-multiref run as `fluxmpi --image A --image B ...`
// with the prompt (fluxmpi's text encoder) matches diffusers' Flux2Pipeline(image=[...]) — the
// reference tokens and ids it checkpoints, every step's latents (kTolPipelineFp32), the PNG (every
// value within 1, 99 % identical); the same bits on 1, 2 and 3 ranks, with --stages, and with
// --patches (the reference tokens travel with the first patch); a job killed in the middle and
// resumed on other rank counts gives the uninterrupted run's latents and PNGs without encoding
// again; a JSON Lines "image" list is the repeated --image. --threads 1 everywhere, fp32.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_reader.h"
#include "core/error.h"
#include "io/png.h"
#include "job_runner.h"
#include "support/multiref_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

// The command line of a fixture case: its prompt, images, sizes, steps, guidance and seed.
std::vector<std::string> case_args(const SubtreeCase& c) {
  const auto& call = c.json.at("call");
  std::vector<std::string> a = {"--model", multiref_pipeline_dir(c), "--prompt", call.at("prompt").get<std::string>(),
                                "--max-sequence-length", std::to_string(call.at("max_sequence_length").get<int64_t>()),
                                "--steps", std::to_string(call.at("steps").get<int64_t>()), "--seed",
                                std::to_string(call.at("seed").get<int64_t>()), "--guidance",
                                std::to_string(call.at("guidance").get<double>()), "--dtype", "fp32", "--no-progress"};
  if (call.contains("height"))
    a.insert(a.end(), {"--height", std::to_string(call.at("height").get<int64_t>()), "--width",
                       std::to_string(call.at("width").get<int64_t>())});
  for (const std::string& image : multiref_images(c)) a.insert(a.end(), {"--image", image});
  return a;
}

class MultirefCli : public testing::TestWithParam<SubtreeCase> {};

TEST_P(MultirefCli, MatchesDiffusers) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, kMultirefSubtree);
  ASSERT_TRUE(tolerance_above_reference_error(c, kTolPipelineFp32));
  TempDir dir("multiref-cli");
  auto args = case_args(c);
  args.insert(args.end(), {"--checkpoint", dir / "run.h5", "-o", dir / "out.png"});
  JobResult r = run_fluxmpi(1, args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mode: multiref"), std::string::npos) << r.output;
  const CaseTensors ref(c.file);
  ckpt::CheckpointReader ck = ckpt::CheckpointReader::open(dir / "run.h5");
  EXPECT_EQ(ck.attributes(0).pipeline, "multiref");
  EXPECT_EQ(ck.attributes(0).references.size(), multiref_images(c).size());
  expect_close(c.name + ": latents/image", ck.dataset(0, "latents/image"), ref.get("image_latents")[0], kTolFp32);
  expect_identical(c.name + ": latents/image_ids", ck.dataset(0, "latents/image_ids").to(at::kLong),
                   ref.get("image_latent_ids")[0]);
  const at::Tensor rows = all_latent_rows(dir / "run.h5"), x = ref.get("latents_steps");
  ASSERT_EQ(rows.size(0), x.size(0)) << c.name;
  for (int64_t k = 0; k < x.size(0); ++k)
    expect_close(str_cat(c.name, ": latents after step ", k), rows[k], x[k], kTolPipelineFp32);
  const at::Tensor ours = png_pixels(dir / "out.png");
  const at::Tensor theirs = png_pixels(multiref_path(c, c.json.at("png").at(0).get<std::string>()));
  ASSERT_EQ(ours.sizes(), theirs.sizes()) << c.name << ": output size";
  const at::Tensor diff = (ours.to(at::kInt) - theirs.to(at::kInt)).abs();
  const double same = diff.eq(0).to(at::kDouble).mean().item<double>();
  std::printf("[ measured ] %s: PNG max |diff| %d, %.4f %% identical\n", c.name.c_str(), diff.max().item<int>(), same * 100);
  EXPECT_LE(diff.max().item<int>(), 1) << c.name;
  EXPECT_GE(same, 0.99) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, MultirefCli, testing::ValuesIn(multiref_cases("pipeline")), image_case_name);

// The bit-identity tests run one klein case with three references (and dev for resume), two images.
class MultirefJobs : public testing::Test {
 protected:
  void SetUp() override {
    for (const SubtreeCase& c : multiref_cases("pipeline"))
      if (c.json.at("reference_hw").size() >= 2 && (klein_.name.empty() || c.json.at("reference_hw").size() >
                                                                                 klein_.json.at("reference_hw").size()))
        if (c.json.at("pipeline_dir").get<std::string>().find("klein") != std::string::npos &&
            !c.json.at("true_cfg").get<bool>())
          klein_ = c;
    REQUIRE_PROJECT_CASE(klein_, kMultirefSubtree);
    dir_ = std::make_unique<TempDir>("multiref-jobs");
  }

  std::vector<std::string> job(const std::string& tag, std::vector<std::string> extra = {}) {
    auto a = case_args(klein_);
    a.insert(a.end(), {"--num-images", "2", "--checkpoint", path(tag + ".h5"), "-o", path(tag + "-{i}.png")});
    // `extra`: option-value pairs; one the case already sets (--steps) takes the new value.
    for (size_t e = 0; e + 1 < extra.size(); e += 2) {
      auto it = std::find(a.begin(), a.end(), extra[e]);
      if (it != a.end()) *(it + 1) = extra[e + 1];
      else a.insert(a.end(), {extra[e], extra[e + 1]});
    }
    return a;
  }
  std::string path(const std::string& name) const { return *dir_ / name; }

  void expect_same(const std::string& tag, const std::string& ref) {
    EXPECT_TRUE(identical(tag + ": latents/steps", all_latent_rows(path(tag + ".h5")), all_latent_rows(path(ref + ".h5"))));
    for (const char* i : {"-00000.png", "-00001.png"})
      EXPECT_TRUE(identical(tag + ": PNG " + i, png_pixels(path(tag + i)), png_pixels(path(ref + i))));
  }

  SubtreeCase klein_;
  std::unique_ptr<TempDir> dir_;
};

TEST_F(MultirefJobs, SameOnEveryRankCountAndWithStages) {
  JobResult one = run_fluxmpi(1, job("np1"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  for (int ranks : {2, 3}) {
    const std::string t = "np" + std::to_string(ranks);
    JobResult r = run_fluxmpi(ranks, job(t));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same(t, "np1");
  }
  // Two pipelines of one rank each: each leader gets the reference tokens from rank 0.
  JobResult staged = run_fluxmpi(2, job("stages", {"--stages", "1"}));
  ASSERT_EQ(staged.exit_code, 0) << staged.output;
  expect_same("stages", "np1");
}

// Patch pipelining: the reference tokens travel with patch 0 (like the text), so a pipelined run is
// bit-identical on every rank count; it differs from the exact run, and a warm-up over every step
// is the exact run bit for bit.
TEST_F(MultirefJobs, PatchesAreTheSameOnEveryRankCount) {
  const std::vector<std::string> patches = {"--patches", "2", "--warmup-steps", "1"};
  JobResult one = run_fluxmpi(1, job("p1", patches));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  for (int ranks : {2, 3}) {
    const std::string t = "p" + std::to_string(ranks);
    JobResult r = run_fluxmpi(ranks, job(t, patches));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same(t, "p1");
  }
  ASSERT_EQ(run_fluxmpi(1, job("exact")).exit_code, 0);
  EXPECT_FALSE(all_latent_rows(path("p1.h5")).equal(all_latent_rows(path("exact.h5"))))
      << "the pipelined steps use the previous step's keys/values";
  const std::string steps = std::to_string(klein_.json.at("call").at("steps").get<int64_t>());
  ASSERT_EQ(run_fluxmpi(2, job("warm", {"--patches", "2", "--warmup-steps", steps})).exit_code, 0);
  EXPECT_TRUE(identical("--patches 2 --warmup-steps " + steps, all_latent_rows(path("warm.h5")), all_latent_rows(path("exact.h5"))));
}

TEST_F(MultirefJobs, KilledThenResumedBitIdentical) {
  const std::vector<std::string> longer = {"--steps", "4"};
  JobResult ref = run_fluxmpi(2, job("ref", longer));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  JobResult killed = run_fluxmpi(2, job("killed", longer), kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:2"});
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  {
    ckpt::CheckpointReader r = ckpt::CheckpointReader::open(path("killed.h5"));
    EXPECT_EQ(r.state(0).status, ckpt::ImageStatus::Denoising);
    EXPECT_EQ(r.attributes(0).pipeline, "multiref");
  }
  for (int ranks : {1, 3}) {
    const std::string t = "resumed" + std::to_string(ranks);
    fs::copy_file(path("killed.h5"), path(t + ".h5"));
    JobResult r = run_fluxmpi(ranks, {"--resume", path(t + ".h5"), "--no-progress", "-o", path(t + "-{i}.png")});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("encoded the reference images"), std::string::npos) << t << ": a resume must not encode again\n"
                                                                                << r.output;
    expect_same(t, "ref");
  }
}

// A JSON Lines "image" list is the repeated --image: the same references, the same bits.
TEST_F(MultirefJobs, JsonLinesImageListIsTheRepeatedOption) {
  ASSERT_EQ(run_fluxmpi(1, job("cli")).exit_code, 0);
  std::string list;
  for (const std::string& image : multiref_images(klein_)) list += (list.empty() ? "\"" : ", \"") + image + "\"";
  const std::string prompt = klein_.json.at("call").at("prompt").get<std::string>();
  std::ofstream(path("refs.jsonl")) << "{\"prompt\": \"" << prompt << "\", \"image\": [" << list << "]}\n"
                                    << "{\"prompt\": \"" << prompt << "\", \"image\": [" << list << "]}\n";
  // The prompts, their images and the image count come from the file.
  const std::vector<std::string> a = job("lines");
  std::vector<std::string> b;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--image" || a[i] == "--prompt" || a[i] == "--num-images") {
      ++i;
      continue;
    }
    b.push_back(a[i]);
  }
  b.insert(b.end(), {"--prompts-file", path("refs.jsonl")});
  JobResult r = run_fluxmpi(2, b);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same("lines", "cli");
}

}  // namespace
}  // namespace fluxmpi::test
