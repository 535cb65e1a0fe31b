// FLUX.1 Redux through the command line (docs/redux.md): every whole-pipeline case of the redux
// fixtures (tests/fixtures/redux, or a held-out twin) run as a user runs it, against diffusers; the
// same bits on 1, 2 and 3 ranks, with --stages and with --patches; a job killed in the middle and
// resumed (on another rank count) equal to an uninterrupted one, encoding nothing again; a resume
// that changes a scale or an image refused. --threads 1 everywhere, fp32.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_reader.h"
#include "job_runner.h"
#include "support/fixtures.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

std::vector<SubtreeCase> pipeline_cases() {
  return project_subtree_cases("redux", [](const std::string& kind) { return kind == "redux_pipeline"; });
}

std::string base_pipeline_of(const SubtreeCase& c) {
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(c.subtree + "/manifest.json"));
  return fixture_root() + "/" + m.at("pipelines").at(c.name.substr(0, c.name.find('/'))).at("base_pipeline").get<std::string>();
}

std::string scales_arg(const nlohmann::json& v) {
  if (!v.is_array()) return nlohmann::json(v.get<double>()).dump();
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + nlohmann::json(x.get<double>()).dump();
  return s;
}

// The command line of a manifest case: what diffusers was called with.
std::vector<std::string> case_args(const SubtreeCase& c) {
  const auto& call = c.json.at("call");
  std::vector<std::string> a = {"--model", base_pipeline_of(c), "--redux-model", c.model_dir, "--height",
                                std::to_string(call.at("height").get<int64_t>()), "--width",
                                std::to_string(call.at("width").get<int64_t>()), "--steps",
                                std::to_string(call.at("num_inference_steps").get<int64_t>()), "--guidance",
                                nlohmann::json(call.at("guidance_scale").get<double>()).dump(), "--seed",
                                std::to_string(call.at("seed").get<int64_t>()), "--max-sequence-length",
                                std::to_string(call.at("max_sequence_length").get<int64_t>()), "--redux-prompt-scale",
                                scales_arg(call.at("prompt_embeds_scale")), "--redux-pooled-scale",
                                scales_arg(call.at("pooled_prompt_embeds_scale")), "--dtype", "fp32", "--no-progress"};
  for (const auto& f : call.at("redux_images")) a.insert(a.end(), {"--redux-image", c.subtree + "/" + f.get<std::string>()});
  if (call.contains("prompt")) a.insert(a.end(), {"--prompt", call.at("prompt").get<std::string>()});
  if (call.contains("prompt_2")) a.insert(a.end(), {"--prompt-2", call.at("prompt_2").get<std::string>()});
  return a;
}

class ReduxCli : public testing::TestWithParam<SubtreeCase> {};

// The case as a user runs it on 2 ranks: the prior's text, the final latents and the PNG.
TEST_P(ReduxCli, MatchesDiffusers) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "redux");
  FLUXMPI_REQUIRE_FIXTURES();
  TempDir dir("redux-cli");
  std::vector<std::string> a = case_args(c);
  a.insert(a.end(), {"--checkpoint", dir / "run.h5", "-o", dir / "out.png"});
  const JobResult r = run_fluxmpi(2, a);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const CaseTensors ref(c.file);
  const ckpt::CheckpointReader ck = ckpt::CheckpointReader::open(dir / "run.h5");
  const ckpt::TextEmbeddings text = ck.text(0);
  expect_close(c.name + ": prompt_embeds", text.prompt_embeds, ref.get("prompt_embeds")[0], kTolPipelineFp32);
  expect_close(c.name + ": pooled_prompt_embeds", text.pooled_prompt_embeds, ref.get("pooled_prompt_embeds")[0],
               kTolPipelineFp32);
  expect_close(c.name + ": image_embeds", text.redux_image_embeds, ref.get("image_embeds"), kTolFp32);
  const ckpt::StepRow last = ck.step(0, c.json.at("call").at("num_inference_steps").get<int64_t>() - 1);
  expect_close(c.name + ": latents_final", last.latents, ref.get("latents_final")[0], kTolPipelineFp32);
  const at::Tensor got = png_pixels(dir / "out.png").to(at::kInt), want = png_pixels(c.subtree + "/" + c.json.at("png").at(0).get<std::string>()).to(at::kInt);
  ASSERT_EQ(got.sizes(), want.sizes());
  const at::Tensor diff = (got - want).abs();
  EXPECT_LE(diff.max().item<int>(), 1) << c.name << ": PNG";
  EXPECT_GE((diff == 0).to(at::kDouble).mean().item<double>(), 0.99) << c.name << ": PNG";
}

INSTANTIATE_TEST_SUITE_P(Redux, ReduxCli, testing::ValuesIn(pipeline_cases()), image_case_name);

// A two-image job of the first case with a prompt (or of the first case), as the parallel tests use it.
class ReduxJobs : public testing::Test {
 protected:
  void SetUp() override {
    FLUXMPI_REQUIRE_FIXTURES();
    const auto cases = pipeline_cases();
    case_ = cases.front();
    for (const auto& c : cases)
      if (c.json.at("call").contains("prompt") && c.json.at("call").at("redux_images").size() > 1) case_ = c;
    REQUIRE_PROJECT_CASE(case_, "redux");
    dir_ = std::make_unique<TempDir>("redux-jobs");
  }
  std::vector<std::string> job(const std::string& tag, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = case_args(case_);
    for (size_t k = 0; k + 1 < a.size(); ++k)
      if (a[k] == "--steps") a[k + 1] = "4";  // enough steps to kill one in the middle
    a.insert(a.end(), {"--num-images", "2", "--checkpoint", path(tag + ".h5"), "-o", path(tag + "-{i}.png")});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string path(const std::string& name) const { return *dir_ / name; }
  void expect_same(const std::string& tag, const std::string& ref) {
    EXPECT_TRUE(identical(tag + ": latents/steps", all_latent_rows(path(tag + ".h5")), all_latent_rows(path(ref + ".h5"))));
    for (const char* i : {"-00000.png", "-00001.png"})
      EXPECT_TRUE(identical(tag + ": PNG " + i, png_pixels(path(tag + i)), png_pixels(path(ref + i))));
  }
  // Uninterrupted on 2 ranks, then killed on rank 1 at step 2 and resumed on 1 and 3 ranks.
  void kill_and_resume() {
    const JobResult ref = run_fluxmpi(2, job("ref"));
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    const JobResult killed = run_fluxmpi(2, job("cut"), kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:2"});
    ASSERT_NE(killed.exit_code, 0) << killed.output;
    for (int ranks : {1, 3}) {
      const std::string t = "cut-np" + std::to_string(ranks);
      fs::copy_file(path("cut.h5"), path(t + ".h5"));
      const JobResult r = run_fluxmpi(ranks, {"--resume", path(t + ".h5"), "--no-progress", "-o", path(t + "-{i}.png")});
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(r.output.find("Redux encoders"), std::string::npos) << t << ": a resume must not encode again\n" << r.output;
      expect_same(t, "ref");
    }
    // A resume asking for other scales or another image is another job.
    fs::copy_file(path("cut.h5"), path("other.h5"));
    const JobResult scale = run_fluxmpi(1, {"--resume", path("other.h5"), "--no-progress", "--redux-prompt-scale", "0.25",
                                            "-o", path("other-{i}.png")});
    EXPECT_NE(scale.exit_code, 0);
    EXPECT_NE(scale.output.find("'redux prompt scale 0'"), std::string::npos) << scale.output;
  }
  SubtreeCase case_;
  std::unique_ptr<TempDir> dir_;
};

TEST_F(ReduxJobs, SameBitsOnEveryRankCountAndWithStages) {
  const JobResult one = run_fluxmpi(1, job("np1"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  for (int ranks : {2, 3}) {
    const std::string tag = "np" + std::to_string(ranks);
    const JobResult r = run_fluxmpi(ranks, job(tag));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same(tag, "np1");
  }
  const JobResult s = run_fluxmpi(2, job("stages", {"--stages", "1"}));  // two one-rank pipelines
  ASSERT_EQ(s.exit_code, 0) << s.output;
  expect_same("stages", "np1");
}

// Patch pipelining is approximate but the same on every rank count; the text (and the image
// tokens in it) travels with patch 0.
TEST_F(ReduxJobs, PatchesAreTheSameOnEveryRankCount) {
  const std::vector<std::string> patches = {"--patches", "2", "--warmup-steps", "1"};
  const JobResult one = run_fluxmpi(1, job("p1", patches));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const JobResult r = run_fluxmpi(3, job("p3", patches));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same("p3", "p1");
}

// Redux with an image mode (img2img of the first reference image): the image tokens in the text, the
// input's latents in the image stream; the same bits on 1 and 3 ranks, the text grown by the tokens.
TEST_F(ReduxJobs, WithImg2ImgTheSameOnEveryRankCount) {
  const auto& images = case_.json.at("call").at("redux_images");
  const std::vector<std::string> i2i = {"--image", case_.subtree + "/" + images.at(0).get<std::string>(), "--strength", "0.6"};
  const JobResult one = run_fluxmpi(1, job("i1", i2i));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const JobResult r = run_fluxmpi(3, job("i3", i2i));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same("i3", "i1");
  const ckpt::CheckpointReader ck = ckpt::CheckpointReader::open(path("i3.h5"));
  EXPECT_TRUE(ck.dataset(0, "inputs/image").defined());
  EXPECT_EQ(ck.text(0).prompt_embeds.size(0),
            case_.json.at("call").at("max_sequence_length").get<int64_t>() + ck.attributes(0).redux.image_tokens);
}

TEST_F(ReduxJobs, KilledThenResumedBitIdenticalWithoutEncodingAgain) { kill_and_resume(); }

// The prior's zero text: no prompt, no text encoder, no token ids in the checkpoint.
TEST_F(ReduxJobs, ZeroTextKilledThenResumedBitIdentical) {
  for (const auto& c : pipeline_cases())
    if (!c.json.at("call").contains("prompt")) case_ = c;
  ASSERT_FALSE(case_.json.at("call").contains("prompt")) << "no case without a prompt";
  kill_and_resume();
}

// --resume refuses Redux inputs that are not the stored ones, naming them, and writes nothing: the
// same images under other names (the stored paths), or a stored file whose pixels changed (the
// checkpoint keeps each image as decoded).
TEST_F(ReduxJobs, ResumeRefusesOtherOrChangedImages) {
  std::vector<std::string> a = job("cut");
  std::vector<std::string> copies;
  for (size_t k = 0; k + 1 < a.size(); ++k)
    if (a[k] == "--redux-image") {  // the job reads copies, so that one can change
      copies.push_back(path("ref" + std::to_string(copies.size()) + ".png"));
      fs::copy_file(a[k + 1], copies.back());
      a[k + 1] = copies.back();
    }
  const JobResult killed = run_fluxmpi(2, a, kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:2"});
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  const at::Tensor rows = all_latent_rows(path("cut.h5"));

  std::vector<std::string> renamed = {"--resume", path("cut.h5"), "--no-progress", "-o", path("r-{i}.png")};
  for (size_t k = 0; k < copies.size(); ++k) {
    renamed.insert(renamed.end(), {"--redux-image", path("renamed" + std::to_string(k) + ".png")});
    fs::copy_file(copies[k], renamed.back());
  }
  const JobResult other = run_fluxmpi(1, renamed);
  EXPECT_NE(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find("'redux image 0' is \"" + copies[0] + "\""), std::string::npos) << other.output;

  // The first image's file now holds another picture of the fixture's inputs.
  std::string replacement;
  const at::Tensor first = png_pixels(copies[0]);
  for (const auto& e : fs::directory_iterator(case_.subtree + "/inputs")) {
    if (e.path().extension() != ".png") continue;
    const at::Tensor t = png_pixels(e.path().string());
    if (!t.sizes().equals(first.sizes()) || !at::equal(t, first)) replacement = e.path().string();
  }
  ASSERT_FALSE(replacement.empty()) << "no other input image in " << case_.subtree << "/inputs";
  fs::copy_file(replacement, copies[0], fs::copy_options::overwrite_existing);
  const JobResult changed = run_fluxmpi(2, {"--resume", path("cut.h5"), "--no-progress", "-o", path("c-{i}.png")});
  EXPECT_NE(changed.exit_code, 0) << changed.output;
  EXPECT_NE(changed.output.find("Redux image '" + copies[0] + "' has changed since the checkpoint was written"),
            std::string::npos)
      << changed.output;
  EXPECT_TRUE(identical("refused resumes: latents/steps", all_latent_rows(path("cut.h5")), rows));
  EXPECT_FALSE(fs::exists(path("r-00000.png")) || fs::exists(path("c-00000.png")));
}

}  // namespace
}  // namespace fluxmpi::test
