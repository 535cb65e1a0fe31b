// ControlNet jobs through the command line (docs/controlnet.md): every FluxControlNetPipeline case
// of the ControlNet fixtures (tests/fixtures/controlnet) run as `fluxmpi --controlnet ...` against
// diffusers' latents (1e-4) and image (pixels within 1 level); the same bits on 1, 2 and 3 ranks,
// with --stages and with --patches; a job killed in the middle and resumed on another rank count
// equals the uninterrupted one, encodes nothing again and refuses another --controlnet-scale,
// --control-image or --controlnet.
// --threads 1 everywhere, fp32.

#include <gtest/gtest.h>

#include <filesystem>

#include "ckpt/checkpoint_reader.h"
#include "core/error.h"
#include "job_runner.h"
#include "support/controlnet_cases.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

// The command line of a pipeline case: its nets, control images, modes, scales and windows, prompt
// (and negative prompt), size, steps, guidance, seed.
std::vector<std::string> case_args(const SubtreeCase& c) {
  const nlohmann::json& call = c.json.at("call");
  std::vector<std::string> a = {"--model", controlnet_base_dir(c), "--prompt", call.at("prompt").get<std::string>(),
                                "--height", std::to_string(call.at("height").get<int64_t>()), "--width",
                                std::to_string(call.at("width").get<int64_t>()), "--steps",
                                std::to_string(call.at("steps").get<int64_t>()), "--guidance",
                                std::to_string(call.at("guidance").get<double>()), "--seed",
                                std::to_string(call.at("seed").get<int64_t>()), "--max-sequence-length", "64",
                                "--dtype", "fp32", "--no-progress"};
  for (const auto& n : call.at("nets")) a.insert(a.end(), {"--controlnet", controlnet_dir(c, n.get<std::string>())});
  const size_t images = call.at("images").size();
  for (size_t k = 0; k < images; ++k) {
    a.insert(a.end(), {"--control-image", controlnet_path(c, "inputs/" + call.at("images")[k].get<std::string>())});
    const auto& mode = call.at("modes")[k];
    a.insert(a.end(), {"--control-mode", mode.is_null() ? "-1" : std::to_string(mode.get<int64_t>())});
    a.insert(a.end(), {"--controlnet-scale", str_cat(call.at("scales")[k].get<double>())});
    a.insert(a.end(), {"--control-guidance-start", str_cat(call.at("start")[k].get<double>())});
    a.insert(a.end(), {"--control-guidance-end", str_cat(call.at("end")[k].get<double>())});
  }
  if (call.contains("negative_prompt"))
    a.insert(a.end(), {"--negative-prompt", call.at("negative_prompt").get<std::string>(), "--true-cfg",
                       str_cat(call.at("true_cfg_scale").get<double>())});
  return a;
}

class ControlNetCli : public testing::TestWithParam<SubtreeCase> {
 protected:
  void SetUp() override { dir_ = std::make_unique<TempDir>("controlnet-jobs"); }
  std::string path(const std::string& name) const { return *dir_ / name; }
  // Runs the case on `ranks` with `extra`, writing <tag>.h5 and <tag>.png (<tag>-{i}.png with `several`).
  JobResult run(const SubtreeCase& c, const std::string& tag, int ranks, std::vector<std::string> extra = {},
                bool several = false) {
    std::vector<std::string> a = case_args(c);
    a.insert(a.end(), {"--checkpoint", path(tag + ".h5"), "-o", path(tag + (several ? "-{i}.png" : ".png"))});
    a.insert(a.end(), extra.begin(), extra.end());
    return run_fluxmpi(ranks, a);
  }
  void expect_same(const std::string& tag, const std::string& ref) {
    EXPECT_TRUE(identical(tag + ": latents/steps", all_latent_rows(path(tag + ".h5")), all_latent_rows(path(ref + ".h5"))));
    EXPECT_TRUE(identical(tag + ": PNG", png_pixels(path(tag + ".png")), png_pixels(path(ref + ".png"))));
  }
  std::unique_ptr<TempDir> dir_;
};

TEST_P(ControlNetCli, MatchesDiffusersAndEveryRankCount) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, kControlNetSubtree);
  FLUXMPI_REQUIRE_FIXTURES();
  ASSERT_TRUE(tolerance_above_f64(c, kTolPipelineFp32));
  JobResult one = run(c, "np1", 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  CaseTensors ref(c.file);
  ckpt::CheckpointReader r = ckpt::CheckpointReader::open(path("np1.h5"));
  EXPECT_EQ(r.attributes(0).pipeline, "controlnet");
  const at::Tensor steps = ref.get("latents_steps");
  expect_close(c.name + ": latents_final", r.latest_latents(0), ref.get("latents_final")[0], kTolPipelineFp32);
  for (int64_t k = 0; k < steps.size(0); ++k)
    expect_close(c.name + ": noise_pred[" + std::to_string(k) + "]", r.dataset(0, "latents/noise_pred")[k],
                 ref.get("noise_pred")[k], kTolPipelineFp32);
  // The picture: every value within 1 level of diffusers' (rounding of values that differ in the
  // last bits), counted.
  const at::Tensor got = png_pixels(path("np1.png")).to(at::kInt), want = ref.get("image_uint8").to(at::kInt);
  const at::Tensor diff = (got - want).abs();
  const int64_t off = diff.gt(0).sum().item<int64_t>();
  std::printf("[ measured ] %s: PNG max |diff| %d level(s), %lld of %lld values differ\n", c.name.c_str(),
              diff.max().item<int>(), static_cast<long long>(off), static_cast<long long>(diff.numel()));
  EXPECT_LE(diff.max().item<int>(), 1) << c.name;
  for (int ranks : {2, 3}) {
    const std::string tag = "np" + std::to_string(ranks);
    JobResult j = run(c, tag, ranks);
    ASSERT_EQ(j.exit_code, 0) << j.output;
    expect_same(tag, "np1");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ControlNetCli, testing::ValuesIn(controlnet_cases("controlnet_pipeline")),
                         image_case_name);

// One case (the merged plain and Union nets) for the schedules that are not diffusers': two images
// under --stages, patch pipelining, kill and resume.
SubtreeCase merged_case() {
  for (const SubtreeCase& c : controlnet_cases("controlnet_pipeline"))
    if (c.json.at("call").at("nets").size() > 1) return c;
  return SubtreeCase{};
}

class ControlNetJobs : public ControlNetCli {};

TEST_F(ControlNetJobs, StagesGiveEveryImageTheSameBits) {
  const SubtreeCase c = merged_case();
  REQUIRE_PROJECT_CASE(c, kControlNetSubtree);
  FLUXMPI_REQUIRE_FIXTURES();
  ASSERT_EQ(run(c, "one", 1, {"--num-images", "3"}, true).exit_code, 0);
  // Three pipelines of one rank, each leader with its own ControlNets; then one of two ranks.
  for (auto [ranks, stages] : {std::pair<int, const char*>{3, "1"}, {2, "2"}}) {
    const std::string tag = str_cat("stages", ranks, "x", stages);
    JobResult j = run(c, tag, ranks, {"--num-images", "3", "--stages", stages}, true);
    ASSERT_EQ(j.exit_code, 0) << j.output;
    EXPECT_TRUE(identical(tag + ": latents/steps", all_latent_rows(path(tag + ".h5")), all_latent_rows(path("one.h5"))));
    for (const char* i : {"-00000.png", "-00001.png", "-00002.png"})
      EXPECT_TRUE(identical(tag + ": PNG " + i, png_pixels(path(tag + i)), png_pixels(path(std::string("one") + i))));
  }
}

TEST_F(ControlNetJobs, PatchPipeliningIsTheSameOnEveryRankCount) {
  const SubtreeCase c = merged_case();
  REQUIRE_PROJECT_CASE(c, kControlNetSubtree);
  FLUXMPI_REQUIRE_FIXTURES();
  const std::vector<std::string> patches = {"--patches", "2", "--warmup-steps", "1"};
  ASSERT_EQ(run(c, "p1", 1, patches).exit_code, 0);
  for (int ranks : {2, 3}) {
    const std::string tag = "p" + std::to_string(ranks);
    JobResult j = run(c, tag, ranks, patches);
    ASSERT_EQ(j.exit_code, 0) << j.output;
    expect_same(tag, "p1");
  }
  // Approximate by design (docs/architecture.md, patch pipelining), but not another picture.
  ASSERT_EQ(run(c, "exact", 1).exit_code, 0);
  EXPECT_FALSE(at::equal(all_latent_rows(path("p1.h5")), all_latent_rows(path("exact.h5"))));
}

TEST_F(ControlNetJobs, KilledThenResumedBitIdenticalAndChecked) {
  const SubtreeCase c = merged_case();
  REQUIRE_PROJECT_CASE(c, kControlNetSubtree);
  FLUXMPI_REQUIRE_FIXTURES();
  ASSERT_EQ(run(c, "ref", 2).exit_code, 0);
  std::vector<std::string> a = case_args(c);
  a.insert(a.end(), {"--checkpoint", path("killed.h5"), "-o", path("killed.png")});
  JobResult killed = run_fluxmpi(2, a, kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:1"});
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  for (int ranks : {1, 3}) {
    const std::string t = "resumed" + std::to_string(ranks);
    fs::copy_file(path("killed.h5"), path(t + ".h5"));
    JobResult r = run_fluxmpi(ranks, {"--resume", path(t + ".h5"), "--no-progress", "-o", path(t + ".png")});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("prepared the"), std::string::npos) << t << ": a resume must not encode the control images again";
    expect_same(t, "ref");
  }
  // Another scale for the first ControlNet is another job.
  fs::copy_file(path("killed.h5"), path("other.h5"));
  JobResult other = run_fluxmpi(1, {"--resume", path("other.h5"), "--no-progress", "-o", path("other.png"),
                                    "--controlnet-scale", "0.3", "--controlnet-scale", "0.5"});
  EXPECT_EQ(other.exit_code, 3) << other.output;
  EXPECT_NE(other.output.find("'controlnets[0].scale'"), std::string::npos) << other.output;
  // Another control image for the first ControlNet (the second's, a file of the same size), and
  // another ControlNet folder (a copy of the first net elsewhere): other jobs too, refused on every
  // rank before anything is written.
  const nlohmann::json& call = c.json.at("call");
  const std::string second_image = controlnet_path(c, "inputs/" + call.at("images")[1].get<std::string>());
  const std::string moved_net = path("moved-net");
  fs::copy(controlnet_dir(c, call.at("nets")[0].get<std::string>()), moved_net);
  const std::vector<std::pair<std::vector<std::string>, std::string>> changes = {
      {{"--control-image", second_image, "--control-image", second_image}, "'controlnets[0].control_image'"},
      {{"--controlnet", moved_net, "--controlnet", controlnet_dir(c, call.at("nets")[1].get<std::string>())},
       "'controlnets[0].controlnet'"}};
  for (const auto& [flags, field] : changes) {
    fs::copy_file(path("killed.h5"), path("changed.h5"), fs::copy_options::overwrite_existing);
    const auto before = fs::file_size(path("changed.h5"));
    std::vector<std::string> args = {"--resume", path("changed.h5"), "--no-progress", "-o", path("changed.png")};
    args.insert(args.end(), flags.begin(), flags.end());
    JobResult changed = run_fluxmpi(2, args);
    EXPECT_EQ(changed.exit_code, 3) << changed.output;
    EXPECT_NE(changed.output.find(field), std::string::npos) << field << ":\n" << changed.output;
    EXPECT_EQ(fs::file_size(path("changed.h5")), before) << field;
    EXPECT_FALSE(fs::exists(path("changed.png"))) << field;
  }
}

// A control image rewritten in place (same path, same size, other pixels) after the checkpoint
// was written: the resume is refused, naming the file.
TEST_F(ControlNetJobs, ResumeRefusesAControlImageChangedInPlace) {
  const SubtreeCase c = merged_case();
  REQUIRE_PROJECT_CASE(c, kControlNetSubtree);
  FLUXMPI_REQUIRE_FIXTURES();
  const nlohmann::json& call = c.json.at("call");
  const std::string first = controlnet_path(c, "inputs/" + call.at("images")[0].get<std::string>());
  const std::string second = controlnet_path(c, "inputs/" + call.at("images")[1].get<std::string>());
  const std::string copy = path("control.png");
  fs::copy_file(first, copy);
  std::vector<std::string> a = case_args(c);
  for (std::string& arg : a)
    if (arg == first) arg = copy;
  a.insert(a.end(), {"--checkpoint", path("killed.h5"), "-o", path("killed.png")});
  ASSERT_NE(run_fluxmpi(2, a, kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:1"}).exit_code, 0);
  fs::copy_file(second, copy, fs::copy_options::overwrite_existing);
  // Of one size, the pixels tell them apart; else already the size the checkpoint records.
  const bool same_size = png_pixels(first).sizes() == png_pixels(second).sizes();
  const std::string expected = same_size ? "control image '" + copy + "' has changed since the checkpoint was written"
                                         : "'controlnets[0].control_image size'";
  JobResult r = run_fluxmpi(2, {"--resume", path("killed.h5"), "--no-progress", "-o", path("resumed.png")});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("resumed.png")));
}

// --control-image with --resume alone belongs to the checkpoint's job: on a Control model's
// (FluxControlPipeline, no ControlNets) it is that model's one image, so the same file resumes
// the job, another is refused by the checkpoint and two are a usage error.
TEST_F(ControlNetJobs, ResumeOfAControlModelTakesItsOneControlImage) {
  FLUXMPI_REQUIRE_FIXTURES();
  const fs::path inputs = fs::path(fixture_root()) / "image-inputs";
  if (!fs::exists(inputs / "tiny-flux-control")) GTEST_SKIP() << "image-inputs fixtures missing";
  const std::string edges = inputs / "inputs/control_edges_64x64.png", photo = inputs / "inputs/photo_64x64.png";
  const std::vector<std::string> job = {"--model", inputs / "tiny-flux-control", "--control-image", edges, "--prompt",
                                        "a harbour at dusk", "--steps", "4", "--seed", "3", "--max-sequence-length", "64",
                                        "--dtype", "fp32", "--no-progress"};
  std::vector<std::string> a = job;
  a.insert(a.end(), {"--checkpoint", path("ref.h5"), "-o", path("ref.png")});
  ASSERT_EQ(run_fluxmpi(2, a).exit_code, 0);
  a = job;
  a.insert(a.end(), {"--checkpoint", path("killed.h5"), "-o", path("killed.png")});
  ASSERT_NE(run_fluxmpi(2, a, kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:1"}).exit_code, 0);
  const std::vector<std::tuple<std::vector<std::string>, int, std::string>> resumes = {
      {{"--control-image", edges}, 0, ""},
      {{"--control-image", photo}, 3, "'input_control_image'"},
      {{"--control-image", edges, "--control-image", edges}, 2, "the checkpoint's job has none"}};
  for (const auto& [flags, code, message] : resumes) {
    fs::copy_file(path("killed.h5"), path("resumed.h5"), fs::copy_options::overwrite_existing);
    std::vector<std::string> r = {"--resume", path("resumed.h5"), "--no-progress", "-o", path("resumed.png")};
    r.insert(r.end(), flags.begin(), flags.end());
    JobResult j = run_fluxmpi(1, r);
    EXPECT_EQ(j.exit_code, code) << j.output;
    if (code == 0) {
      EXPECT_TRUE(identical("resumed: latents/steps", all_latent_rows(path("resumed.h5")), all_latent_rows(path("ref.h5"))));
      EXPECT_TRUE(identical("resumed: PNG", png_pixels(path("resumed.png")), png_pixels(path("ref.png"))));
      fs::remove(path("resumed.png"));
    } else {
      EXPECT_NE(j.output.find(message), std::string::npos) << message << ":\n" << j.output;
      EXPECT_FALSE(fs::exists(path("resumed.png")));
    }
  }
}

}  // namespace
}  // namespace fluxmpi::test
