// Several pipelines in one job (`--stages S`, docs/hpc.md): 8 images from a prompts file on 4
// ranks with S = 1, 2 and 4 give the same images and the same checkpoint, dataset by dataset, as
// one process (--threads 1 everywhere); a deliberately slow pipeline (FLUXMPI_DELAY) takes fewer
// work groups and changes no bit; a pipeline leader killed mid-job, and the writer (rank 0) killed
// mid-job, end every rank promptly, and the killed --stages 2 job resumes on other layouts to the
// uninterrupted result; true CFG, patches and micro-batches and an inpainting job run inside each
// pipeline unchanged, and so do FLUX.2 jobs; --stages that does not divide the ranks is one line;
// --dry-run prints the pipelines with their ranks and hosts.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "ckpt/checkpoint_reader.h"
#include "core/error.h"
#include "ckpt/format.h"
#include "job_runner.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

// fluxmpi processes whose command line mentions `needle`.
int processes_mentioning(const std::string& needle) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find("fluxmpi") != std::string::npos && cmd.find(needle) != std::string::npos && std::to_string(::getpid()) != pid) ++n;
  }
  return n;
}

// Every dataset of every image (committed rows), the status and last_step: bit for bit.
void expect_same_checkpoint(const std::string& got_path, const std::string& ref_path, const std::string& what) {
  ckpt::CheckpointReader got = ckpt::CheckpointReader::open(got_path);
  ckpt::CheckpointReader ref = ckpt::CheckpointReader::open(ref_path);
  ASSERT_EQ(got.num_images(), ref.num_images()) << what;
  for (int64_t i = 0; i < ref.num_images(); ++i) {
    EXPECT_EQ(got.state(i).status, ref.state(i).status) << what << ": image " << i;
    for (const ckpt::DatasetSpec& spec : ckpt::dataset_specs(ref.shape(i))) {
      if (spec.name == "status") continue;
      EXPECT_TRUE(identical(str_cat(what, ": image ", i, " ", spec.name), got.dataset(i, spec.name), ref.dataset(i, spec.name)));
    }
  }
}

class Stages : public testing::Test {
 protected:
  static constexpr int kImages = 8;
  static void SetUpTestSuite() {
    dir_ = new TempDir("stages");
    JobResult r = run_program(make_tiny_model_bin(), {"--out", *dir_ / "model", "--preset", "tiny"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(*dir_ / "prompts.txt") << "a lighthouse on a cliff\nan old stone bridge\n";
    // The one-process reference of the job every test below varies.
    JobResult ref = run_fluxmpi(1, args("ref"));
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  // 2 prompts x 4 images, 64x64, 4 steps, fp32; --threads 1 is the runner's.
  static std::vector<std::string> args(const std::string& tag, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"--model", *dir_ / "model", "--prompts-file", *dir_ / "prompts.txt", "--num-images", "4",
                                  "--height", "64", "--width", "64", "--steps", "4", "--seed", "21", "--dtype", "fp32",
                                  "--no-progress", "--checkpoint", *dir_ / (tag + ".h5"), "-o", *dir_ / (tag + "-{i}.png")};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  static std::string png(const std::string& tag, int i) {
    char name[32];
    std::snprintf(name, sizeof name, "-%05d.png", i);
    return *dir_ / (tag + name);
  }
  static void expect_same_job(const std::string& tag, const std::string& ref) {
    expect_same_checkpoint(*dir_ / (tag + ".h5"), *dir_ / (ref + ".h5"), tag);
    for (int i = 0; i < kImages; ++i)
      EXPECT_TRUE(identical(str_cat(tag, ": PNG pixels of image ", i), png_pixels(png(tag, i)), png_pixels(png(ref, i))));
  }
  // "N work group(s) taken" of each leader (--log-level debug).
  static std::map<int, int> groups_taken(const std::string& output) {
    std::map<int, int> taken;
    static const std::regex re(R"(fluxmpi\[rank (\d+)/\d+\]: .*?(\d+) work group\(s\) taken)");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it)
      taken[std::stoi((*it)[1])] = std::stoi((*it)[2]);
    return taken;
  }
  static TempDir* dir_;
};
TempDir* Stages::dir_ = nullptr;

TEST_F(Stages, FourRanksInAnyPipelinesGiveTheOneProcessBits) {
  for (int S : {1, 2, 4}) {
    const std::string tag = "s" + std::to_string(S);
    JobResult r = run_fluxmpi(4, args(tag, {"--stages", std::to_string(S), "--log-level", "debug"}));
    ASSERT_EQ(r.exit_code, 0) << tag << ":\n" << r.output;
    expect_same_job(tag, "ref");
    if (S < 4) {
      const std::map<int, int> taken = groups_taken(r.output);
      int total = 0;
      for (int leader = 0; leader < 4; leader += S) total += taken.count(leader) ? taken.at(leader) : 0;
      EXPECT_EQ(total, kImages) << tag << ": every work group is taken exactly once\n" << r.output;
    }
    EXPECT_NE(r.output.find("made 8 images in"), std::string::npos) << r.output;
  }
}

TEST_F(Stages, SlowPipelineTakesFewerGroupsAndChangesNoBit) {
  // Rank 2 leads pipeline 1 and sleeps 300 ms before each unit of work.
  JobResult r = run_fluxmpi(4, args("slow", {"--stages", "2", "--log-level", "debug"}), kHangGuardSeconds,
                            {"FLUXMPI_DELAY=2:300"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::map<int, int> taken = groups_taken(r.output);
  ASSERT_EQ(taken.size(), 2u) << r.output;
  EXPECT_EQ(taken.at(0) + taken.at(2), kImages) << r.output;
  EXPECT_GT(taken.at(0), taken.at(2)) << "the fast pipeline takes more groups:\n" << r.output;
  expect_same_job("slow", "ref");
}

TEST_F(Stages, KilledLeaderEndsTheJobAndItResumesOnOtherLayouts) {
  JobResult killed = run_fluxmpi(4, args("k", {"--stages", "2"}), kHangGuardSeconds, {"FLUXMPI_FAULT=kill@2:2"});
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_EQ(killed.hang, "") << killed.output;  // ended by itself, not killed as hung
  EXPECT_EQ(processes_mentioning(*dir_ / "k.h5"), 0) << "a rank is still running";
  {
    ckpt::CheckpointReader r = ckpt::CheckpointReader::open(*dir_ / "k.h5");  // consistent after the kill
    int decoded = 0;
    for (int64_t i = 0; i < r.num_images(); ++i) decoded += r.state(i).status == ckpt::ImageStatus::Decoded;
    EXPECT_LT(decoded, kImages);
  }
  const std::vector<std::pair<int, std::vector<std::string>>> layouts = {{3, {}}, {2, {"--stages", "1"}}};
  for (const auto& [ranks, extra] : layouts) {
    const std::string tag = str_cat("k", ranks, extra.empty() ? "" : "s1");
    fs::copy_file(*dir_ / "k.h5", *dir_ / (tag + ".h5"));
    std::vector<std::string> a = {"--resume", *dir_ / (tag + ".h5"), "--no-progress", "-o", *dir_ / (tag + "-{i}.png")};
    a.insert(a.end(), extra.begin(), extra.end());
    JobResult r = run_fluxmpi(ranks, a);
    ASSERT_EQ(r.exit_code, 0) << tag << ":\n" << r.output;
    EXPECT_TRUE(identical(tag + ": latents/steps", all_latent_rows(*dir_ / (tag + ".h5")), all_latent_rows(*dir_ / "ref.h5")));
    ckpt::CheckpointReader done = ckpt::CheckpointReader::open(*dir_ / (tag + ".h5"));
    ckpt::CheckpointReader ref = ckpt::CheckpointReader::open(*dir_ / "ref.h5");
    for (int i = 0; i < kImages; ++i) {
      EXPECT_EQ(done.state(i).status, ckpt::ImageStatus::Decoded) << tag << ": image " << i;
      EXPECT_TRUE(identical(str_cat(tag, ": image ", i, " pixels in the checkpoint"), done.dataset(i, "image"), ref.dataset(i, "image")));
    }
  }
}

TEST_F(Stages, KilledWriterEndsTheJob) {
  JobResult r = run_fluxmpi(4, args("w", {"--stages", "2"}), kHangGuardSeconds, {"FLUXMPI_FAULT=kill@0:2"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.hang, "") << r.output;
  EXPECT_EQ(processes_mentioning(*dir_ / "w.h5"), 0) << "a rank is still running";
  ckpt::CheckpointReader ck = ckpt::CheckpointReader::open(*dir_ / "w.h5");
  EXPECT_EQ(ck.num_images(), kImages);
}

TEST_F(Stages, FailingLeaderIsOneLineOnEveryRank) {
  JobResult r = run_fluxmpi(4, args("t", {"--stages", "2"}), kHangGuardSeconds, {"FLUXMPI_FAULT=throw@2:1"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.hang, "") << r.output;
  EXPECT_NE(r.output.find("fluxmpi[rank 2/4]: InternalError: fault injected by FLUXMPI_FAULT at step 1"), std::string::npos)
      << r.output;
  EXPECT_EQ(processes_mentioning(*dir_ / "t.h5"), 0);
}

TEST_F(Stages, TrueCfgPatchesAndMicrobatchesInsideEachPipeline) {
  const std::vector<std::string> options = {"--true-cfg", "2", "--negative-prompt", "blurry", "--patches", "2",
                                            "--microbatch", "2", "--checkpoint-every", "2"};
  ASSERT_EQ(run_fluxmpi(1, args("opt1", options)).exit_code, 0);
  auto staged = options;
  staged.insert(staged.end(), {"--stages", "2"});
  JobResult r = run_fluxmpi(4, args("opt4", staged));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_job("opt4", "opt1");
}

TEST_F(Stages, StagesThatDoNotDivideTheRanksIsOneLine) {
  JobResult r = run_fluxmpi(4, args("bad", {"--stages", "3"}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--stages 3 does not divide the 4 ranks of this job into pipelines (use one of 1, 2, 4)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(*dir_ / "bad.h5"));
}

TEST_F(Stages, DryRunPrintsThePipelinesRanksAndHosts) {
  JobResult r = run_fluxmpi(4, {"--model", *dir_ / "model", "--prompt", "x", "--stages", "2", "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pipelines: 2 x 2 ranks (--stages 2)"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(  pipeline 1: ranks 2-3 \(leader 2\) on \S+)"))) << r.output;
  // The plan below is the 2-rank plan every pipeline runs.
  EXPECT_NE(r.output.find("every pipeline runs the plan below"), std::string::npos) << r.output;
}

// Inpainting: the per-step blend's inputs travel to the leaders with the groups' inputs.
TEST(StagesImageInputs, InpaintOnTwoPipelinesIsTheOneProcessJob) {
  FLUXMPI_REQUIRE_FIXTURES();
  const fs::path inputs = fs::path(fixture_root()) / "image-inputs" / "inputs";
  if (!fs::exists(inputs / "photo_64x64.png")) {
    if (running_in_ci()) FAIL() << "image-inputs fixtures missing under " << fixture_root();
    GTEST_SKIP() << "image-inputs fixtures missing";
  }
  TempDir dir("stages-inpaint");
  auto job = [&](const std::string& tag) {
    return std::vector<std::string>{"--model", (fs::path(fixture_root()) / "tiny-flux-dev").string(), "--prompt",
                                    "a watercolor of a harbour", "--num-images", "4", "--steps", "3", "--seed", "11",
                                    "--dtype", "fp32", "--no-progress", "--max-sequence-length", "64",
                                    "--image", (inputs / "photo_64x64.png").string(), "--mask",
                                    (inputs / "mask_ellipse_64x64.png").string(), "--strength", "0.9",
                                    "--checkpoint", dir / (tag + ".h5"), "-o", dir / (tag + "-{i}.png")};
  };
  ASSERT_EQ(run_fluxmpi(1, job("one")).exit_code, 0);
  auto staged = job("two");
  staged.insert(staged.end(), {"--stages", "1"});
  JobResult r = run_fluxmpi(2, staged);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_checkpoint(dir / "two.h5", dir / "one.h5", "inpaint on 2 pipelines");
  for (const char* i : {"-00000.png", "-00001.png", "-00002.png", "-00003.png"})
    EXPECT_TRUE(identical(std::string("inpaint PNG ") + i, png_pixels(dir / (std::string("two") + i)),
                          png_pixels(dir / (std::string("one") + i))));
}

// FLUX.2 (klein base: true CFG, modulation vectors in every message, the FLUX.2 decoder on each
// leader) on 2 pipelines of 2 ranks: the one-process job.
TEST(StagesFlux2, KleinBaseOnTwoPipelinesOfTwoIsTheOneProcessJob) {
  FLUXMPI_REQUIRE_FIXTURES();
  const fs::path model = fs::path(fixture_root()) / "flux2" / "tiny-flux2-klein-base";
  if (!fs::exists(model / "model_index.json")) {
    if (running_in_ci()) FAIL() << "flux2 fixtures missing under " << fixture_root();
    GTEST_SKIP() << "flux2 fixtures missing";
  }
  TempDir dir("stages-flux2");
  auto job = [&](const std::string& tag) {
    return std::vector<std::string>{"--model", model.string(), "--prompt", "a lighthouse on a cliff at dusk", "--num-images", "4",
                                    "--steps", "3", "--seed", "5", "--height", "48", "--width", "64", "--dtype", "fp32",
                                    "--guidance", "4", "--no-progress", "--max-sequence-length", "64",
                                    "--checkpoint", dir / (tag + ".h5"), "-o", dir / (tag + "-{i}.png")};
  };
  JobResult one = run_fluxmpi(1, job("one"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto staged = job("four");
  staged.insert(staged.end(), {"--stages", "2"});
  JobResult r = run_fluxmpi(4, staged);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_checkpoint(dir / "four.h5", dir / "one.h5", "FLUX.2 klein base on 2 pipelines of 2");
  for (const char* i : {"-00000.png", "-00001.png", "-00002.png", "-00003.png"})
    EXPECT_TRUE(identical(std::string("FLUX.2 PNG ") + i, png_pixels(dir / (std::string("four") + i)),
                          png_pixels(dir / (std::string("one") + i))));
}

}  // namespace
}  // namespace fluxmpi::test
