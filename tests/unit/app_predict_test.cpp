// `fluxmpi --dry-run --predict PROFILE` (app/predict.h) on a hollow FLUX.1-dev folder: the printed
// prediction is exactly what tools/sim/fluxsim.py prints when run directly with the job's options
// (ranks and --stages, one pipeline's slices, sizes, steps, patches, microbatch, images, prompts,
// passes, checkpoint, tiled decode over the decode ranks); a missing python3, a missing, malformed
// or mismatched profile, --predict without --dry-run and a FLUX.2 job are one line each.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "app/predict.h"
#include "app/prepare.h"
#include "core/error.h"
#include "support/fixtures.h"
#include "support/hollow_model.h"
#include "support/simulator.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;
using test::run_simulator;
using test::sim_dir;

std::string profile(const std::string& name) { return (fs::path(sim_dir()) / "profiles" / name).string(); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class Predict : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("fluxmpi-predict-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    if (fs::is_directory(fs::path(test::assets_root()) / "configs" / "FLUX.1-dev"))
      dev_ = test::write_hollow_model("FLUX.1-dev", (root_ / "dev").string()).root;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  void SetUp() override {
    if (dev_.empty()) {
      const std::string why = "real FLUX configs not found under '" + test::assets_root() + "/configs'";
      if (test::running_in_ci()) FAIL() << why;
      GTEST_SKIP() << why;
    }
  }
  static Preparation dry_run(int ranks, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model", dev_, "--dry-run"};
    args.insert(args.end(), extra.begin(), extra.end());
    return prepare_run(args, ranks);
  }
  static fs::path root_;
  static std::string dev_;
};
fs::path Predict::root_;
std::string Predict::dev_;

TEST_F(Predict, PrintsWhatTheSimulatorPrintsForTheJob) {
  const std::string gpu = profile("flux1-dev-h100.json");
  // 8 ranks, 2 prompts x 3 images at 2048^2, tiled (9 tiles over 8 ranks), microbatch 2, a checkpoint.
  const std::string prompts = (root_ / "prompts.txt").string();
  std::ofstream(prompts) << "a red barn\na blue lake\n";
  Preparation p = dry_run(8, {"--prompts-file", prompts, "--num-images", "3", "--height", "2048", "--width", "2048",
                              "--steps", "20", "--microbatch", "2", "--vae-tiling", "--checkpoint",
                              (root_ / "run.h5").string(), "--predict", gpu});
  ASSERT_TRUE(p.dry_run_plan);
  std::string partition;
  for (int r = 0; r < 8; ++r)
    partition += (r ? "," : "") + std::to_string(r) + ":" + std::to_string(p.dry_run_plan->blocks(r).first) + "-" +
                 std::to_string(p.dry_run_plan->blocks(r).last);
  const std::string expected = run_simulator({"--profile", gpu, "--ranks", "8", "--partition", partition, "--microbatch", "2",
                                              "--patches", "1", "--warmup", "1", "--images", "6", "--prompts", "2", "--steps",
                                              "20", "--height", "2048", "--width", "2048", "--max-sequence-length", "512",
                                              "--checkpoint", "--checkpoint-every", "1", "--vae-tiling", "--decode-ranks",
                                              "8", "--vae-tile", "128", "--vae-scale", "8", "--expect-transformer",
                                              "19,38,24,128"});
  ASSERT_NE(expected.find("images/hour"), std::string::npos) << expected;
  EXPECT_NE(expected.find("decode "), std::string::npos) << expected;
  EXPECT_NE(expected.find("9 tiles over 8 rank(s)"), std::string::npos) << expected;
  const size_t at = p.output.find("prediction (python3 ");
  ASSERT_NE(at, std::string::npos) << p.output;
  const std::string printed = p.output.substr(p.output.find('\n', at) + 1);
  EXPECT_EQ(printed, expected);

  // Patches, true CFG and an untiled decode reach the simulator too.
  p = dry_run(4, {"--prompt", "a cat", "--patches", "4", "--warmup-steps", "2", "--true-cfg", "3", "--negative-prompt", "blur",
                  "--steps", "10", "--predict", gpu});
  partition.clear();
  for (int r = 0; r < 4; ++r)
    partition += (r ? "," : "") + std::to_string(r) + ":" + std::to_string(p.dry_run_plan->blocks(r).first) + "-" +
                 std::to_string(p.dry_run_plan->blocks(r).last);
  const std::string cfg = run_simulator({"--profile", gpu, "--ranks", "4", "--partition", partition, "--microbatch", "1",
                                         "--patches", "4", "--warmup", "2", "--images", "1", "--prompts", "1", "--steps",
                                         "10", "--height", "1024", "--width", "1024", "--max-sequence-length", "512",
                                         "--true-cfg", "--expect-transformer", "19,38,24,128"});
  EXPECT_EQ(p.output.substr(p.output.find('\n', p.output.find("prediction (python3 ")) + 1), cfg);
}

TEST_F(Predict, StagesGiveTheSimulatorThePipelines) {
  const std::string gpu = profile("flux1-dev-h100.json");
  // 8 ranks as 2 pipelines of 4 at 2048^2, tiled: the plan and the decode ranks are one pipeline's.
  Preparation p = dry_run(8, {"--prompt", "a red barn", "--num-images", "16", "--height", "2048", "--width", "2048",
                              "--steps", "20", "--stages", "4", "--vae-tiling", "--predict", gpu});
  ASSERT_TRUE(p.dry_run_plan);
  ASSERT_EQ(p.dry_run_plan->world_size(), 4);
  std::string partition;
  for (int r = 0; r < 4; ++r)
    partition += (r ? "," : "") + std::to_string(r) + ":" + std::to_string(p.dry_run_plan->blocks(r).first) + "-" +
                 std::to_string(p.dry_run_plan->blocks(r).last);
  const std::string expected = run_simulator({"--profile", gpu, "--ranks", "8", "--stages", "4", "--partition", partition,
                                              "--microbatch", "1", "--patches", "1", "--warmup", "1", "--images", "16",
                                              "--prompts", "1", "--steps", "20", "--height", "2048", "--width", "2048",
                                              "--max-sequence-length", "512", "--vae-tiling", "--decode-ranks", "4",
                                              "--vae-tile", "128", "--vae-scale", "8", "--expect-transformer",
                                              "19,38,24,128"});
  ASSERT_NE(expected.find("images/hour"), std::string::npos) << expected;
  EXPECT_NE(expected.find("8 ranks = 2 pipeline(s) x 4 stages"), std::string::npos) << expected;
  EXPECT_NE(expected.find("9 tiles over 4 rank(s)"), std::string::npos) << expected;
  const size_t at = p.output.find("prediction (python3 ");
  ASSERT_NE(at, std::string::npos) << p.output;
  EXPECT_EQ(p.output.substr(p.output.find('\n', at) + 1), expected);
}

TEST_F(Predict, ProblemsAreOneLineNamingPredict) {
  EXPECT_EQ(error_of([] { dry_run(2, {"--predict", "/nonexistent/p.json"}); }),
            "--predict: profile '/nonexistent/p.json': No such file or directory");
  const std::string bad = (root_ / "bad.json").string();
  std::ofstream(bad) << "{\"name\": ";
  EXPECT_EQ(error_of([&] { dry_run(2, {"--predict", bad}); }).rfind("--predict: profile '" + bad + "' is not JSON: ", 0), 0u);
  const std::string incomplete = (root_ / "incomplete.json").string();
  std::ofstream(incomplete) << "{\"name\": \"x\"}";
  EXPECT_EQ(error_of([&] { dry_run(2, {"--predict", incomplete}); }),
            "--predict: profile '" + incomplete + "' is not a fluxsim profile (tools/sim/README.md): missing key 'model'");
  // The bench model's profile does not describe FLUX.1-dev.
  const std::string other = error_of([] { dry_run(2, {"--predict", profile("local-cpu.json")}); });
  EXPECT_NE(other.find("models a transformer of 4 double + 8 single blocks, 6 heads x 128; the job's has 19 + 38, 24 x 128"),
            std::string::npos)
      << other;
  EXPECT_EQ(other.find('\n'), std::string::npos) << other;
  // No python3 on PATH.
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", root_.c_str(), 1);
  const std::string no_python = error_of([] { dry_run(2, {"--predict", profile("flux1-dev-h100.json")}); });
  ::setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(no_python, "--predict: python3 was not found on PATH (the prediction runs tools/sim/fluxsim.py)");
  // Only with --dry-run.
  const std::string alone = error_of([] { prepare_run({"--model", dev_, "--prompt", "x", "--predict", "p.json"}, 1); });
  EXPECT_NE(alone.find("--predict"), std::string::npos) << alone;
  EXPECT_NE(alone.find("needs --dry-run"), std::string::npos) << alone;
}

TEST(PredictFlux2, IsRefusedInOneLine) {
  const fs::path klein = fs::path(test::fixture_root()) / "flux2" / "tiny-flux2-klein";
  if (!fs::is_directory(klein)) {
    if (test::running_in_ci()) FAIL() << "flux2 fixture missing: " << klein;
    GTEST_SKIP() << "flux2 fixture missing: " << klein;
  }
  EXPECT_EQ(error_of([&] {
              prepare_run({"--model", klein.string(), "--dry-run", "--height", "64", "--width", "64", "--predict",
                           profile("local-cpu.json")},
                          2);
            }),
            "--predict: the schedule model covers FLUX.1 jobs (tools/sim/README.md); this is a FLUX.2 model");
}

}  // namespace
}  // namespace fluxmpi::app
