// Patch pipelining (--patches M, --warmup-steps W) as a user runs it: for fixed M and W the result
// is bit-identical on 1, 2 and 3 ranks and any partition (several images with true CFG too); a
// warm-up covering every step, and --patches 1, give exactly the exact run; a killed patched run
// resumes deterministically with its warm-up again; --resume refuses other M or W; a message
// labelled with the wrong patch is a CommError quoting both headers.

#include <gtest/gtest.h>

#include <filesystem>

#include "ckpt/checkpoint_reader.h"
#include "job_runner.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

class Patches : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("patches");
    // 2 double + 3 single blocks; 64 x 64 pixels are 4 rows of 4 image tokens.
    JobResult r = run_program(make_tiny_model_bin(), {"--out", *dir_ / "model", "--preset", "tiny"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::vector<std::string> args(const std::string& tag, const std::vector<std::string>& extra,
                                       const std::string& images = "1") {
    std::vector<std::string> a = {"--model", *dir_ / "model", "--prompt", "a lighthouse in the fog", "--num-images", images,
                                  "--height", "64", "--width", "64", "--steps", "6", "--seed", "11", "--no-progress",
                                  "--checkpoint", *dir_ / (tag + ".h5"), "-o", *dir_ / (tag + "-{i}.png")};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  static JobResult run(int ranks, const std::string& tag, const std::vector<std::string>& extra, const std::string& images = "1",
                       const std::vector<std::string>& env = {}) {
    return run_fluxmpi(ranks, args(tag, extra, images), 300, env);
  }
  static at::Tensor rows(const std::string& tag) { return all_latent_rows(*dir_ / (tag + ".h5")); }
  static at::Tensor exact_marks(const std::string& tag, int64_t image = 0) {
    return ckpt::CheckpointReader::open(*dir_ / (tag + ".h5")).dataset(image, "latents/exact");
  }
  // Run `tag` has every latent row and PNG pixel of run `ref`.
  static void expect_same(const std::string& what, const std::string& tag, const std::string& ref, int images = 1) {
    EXPECT_TRUE(identical(what + ": latents/steps", rows(tag), rows(ref)));
    for (int i = 0; i < images; ++i) {
      const std::string png = "-0000" + std::to_string(i) + ".png";
      EXPECT_TRUE(identical(what + ": PNG " + png, png_pixels(*dir_ / (tag + png)), png_pixels(*dir_ / (ref + png))));
    }
  }
  static TempDir* dir_;
};
TempDir* Patches::dir_ = nullptr;

TEST_F(Patches, ResultIsIndependentOfRanksAndPartition) {
  const std::vector<std::string> mode = {"--patches", "4", "--warmup-steps", "2"};
  JobResult r = run(1, "p1", mode);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(identical("latents/exact of a 6-step run with W = 2", exact_marks("p1"),
                        at::tensor({1, 1, 0, 0, 0, 0}, at::kByte)));
  ASSERT_EQ(run(1, "exact", {}).exit_code, 0);
  EXPECT_FALSE(rows("p1").equal(rows("exact"))) << "the pipelined steps use stale keys/values";
  const std::vector<std::pair<int, std::string>> layouts = {
      {2, ""}, {2, "0:0-0,1:1-4"}, {2, "0:0-1,1:2-4"}, {2, "0:0-2,1:3-4"}, {3, ""}};
  int n = 0;
  for (const auto& [ranks, partition] : layouts) {
    const std::string tag = "p" + std::to_string(ranks) + "-" + std::to_string(n++);
    auto extra = mode;
    if (!partition.empty()) extra.insert(extra.end(), {"--partition", partition});
    JobResult j = run(ranks, tag, extra);
    ASSERT_EQ(j.exit_code, 0) << tag << ":\n" << j.output;
    expect_same(tag + " (" + std::to_string(ranks) + " ranks" + (partition.empty() ? "" : ", --partition " + partition) + ")",
                tag, "p1");
  }
}

TEST_F(Patches, SeveralImagesWithTrueCfgFlowAsUnits) {
  const std::vector<std::string> mode = {"--patches", "2", "--warmup-steps", "1", "--true-cfg", "2.5", "--negative-prompt",
                                         "blurry"};
  ASSERT_EQ(run(1, "cfg1", mode, "2").exit_code, 0);
  JobResult r3 = run(3, "cfg3", mode, "2");
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  expect_same("2 images, true CFG, 3 ranks", "cfg3", "cfg1", 2);
  auto batched = mode;
  batched.insert(batched.end(), {"--microbatch", "2"});
  ASSERT_EQ(run(1, "cfgmb1", batched, "2").exit_code, 0);
  JobResult r2 = run(2, "cfgmb2", batched, "2");
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  expect_same("2 images in one microbatch, true CFG, 2 ranks", "cfgmb2", "cfgmb1", 2);
}

TEST_F(Patches, WarmUpCoveringEveryStepAndOnePatchAreTheExactRun) {
  ASSERT_EQ(run(2, "ref", {}).exit_code, 0);
  JobResult w = run(2, "w6", {"--patches", "4", "--warmup-steps", "6"});
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(w.output.find("every step runs exact"), std::string::npos) << w.output;
  expect_same("--patches 4 --warmup-steps 6", "w6", "ref");
  ASSERT_EQ(run(3, "m1", {"--patches", "1", "--warmup-steps", "3"}).exit_code, 0);
  expect_same("--patches 1 --warmup-steps 3 on 3 ranks", "m1", "ref");
}

TEST_F(Patches, KilledPatchedRunResumesWithItsWarmUp) {
  const std::vector<std::string> mode = {"--patches", "2", "--warmup-steps", "1"};
  JobResult killed = run(2, "k", mode, "1", {"FLUXMPI_FAULT=kill@1:4"});
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  int64_t k = 0;
  {
    ckpt::CheckpointReader r = ckpt::CheckpointReader::open(*dir_ / "k.h5");
    k = r.state(0).last_step + 1;
    ASSERT_GE(k, 2) << "the kill at step 4 comes after some pipelined steps";
    ASSERT_LT(k, 6);
  }
  JobResult inspect = run_program(inspect_bin(), {*dir_ / "k.h5"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("patch-pipelined, 2 patches, 1 warm-up step(s); exact steps 0; pipelined 1"),
            std::string::npos)
      << inspect.output;
  for (int ranks : {1, 2}) {
    const std::string tag = "k" + std::to_string(ranks);
    fs::copy_file(*dir_ / "k.h5", *dir_ / (tag + ".h5"));
    JobResult r = run_fluxmpi(ranks, {"--resume", *dir_ / (tag + ".h5"), "--no-progress", "-o", *dir_ / (tag + "-{i}.png")});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("deterministic but not bit-identical"), std::string::npos) << r.output;
    std::vector<uint8_t> expected(6, 0);
    expected[0] = expected[static_cast<size_t>(k)] = 1;  // the first step, and the warm-up again at k
    EXPECT_TRUE(identical(tag + ": latents/exact", exact_marks(tag), at::tensor(std::vector<int64_t>(expected.begin(), expected.end())).to(at::kByte)));
  }
  expect_same("resumed on 2 ranks against 1 rank", "k2", "k1");
}

TEST_F(Patches, ResumeRefusesOtherPatchesOrWarmUp) {
  ASSERT_EQ(run(1, "done", {"--patches", "2"}).exit_code, 0);
  for (auto [option, value, field] : {std::tuple<std::string, std::string, std::string>{"--patches", "4", "'patches' is 2"},
                                      {"--warmup-steps", "2", "'warmup_steps' is 1"}}) {
    fs::copy_file(*dir_ / "done.h5", *dir_ / "other.h5", fs::copy_options::overwrite_existing);
    JobResult r = run_fluxmpi(1, {"--resume", *dir_ / "other.h5", "--no-progress", option, value}, 60);
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_NE(r.output.find(field + " in the checkpoint, the command line asks for " + value), std::string::npos) << r.output;
  }
}

TEST_F(Patches, TooManyPatchesAndTheBuffersInTheDryRun) {
  JobResult r = run(2, "many", {"--patches", "5"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--patches 5 exceeds the 4 rows of image tokens of a 64x64 image"), std::string::npos) << r.output;
  // 2 x (16 image + 256 text tokens) x width 32 x 4 bytes = 68 KiB per block, for 1 image and 1 pass.
  JobResult dry = run_fluxmpi(2, {"--model", *dir_ / "model", "--height", "64", "--width", "64", "--steps", "6", "--dry-run",
                                  "--max-sequence-length", "256", "--patches", "2", "--dtype", "fp32"}, 60);
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("patch pipelining: key/value buffers 68.0 KiB per block (in the peaks): rank 0 "),
            std::string::npos)
      << dry.output;
}

TEST_F(Patches, WrongPatchInAHeaderIsACommErrorQuotingBothSides) {
  JobResult r = run(2, "hdr", {"--patches", "2"}, "1", {"FLUXMPI_FAULT=patch@0:3"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("fluxmpi[rank 1/2]: CommError: rank 1 expected "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(image 0, step 3, pass 0, patch 0, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("from rank 0, got "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(image 0, step 3, pass 0, patch 1, "), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30);
}

}  // namespace
}  // namespace fluxmpi::test
