// Many images flow through the ranks like GPipe micro-batches: with --microbatch 1 (the default)
// a job of several images is bit-identical to making the images one at a time; with
// --microbatch 2 (two images per message) it stays within the fp32 pipeline tolerance.

#include <gtest/gtest.h>

#include <cstdio>

#include "job_runner.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace {

class Pipelining : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("pipelining");
    JobResult r = run_program(make_tiny_model_bin(), {"--out", *dir_ / "model", "--preset", "tiny"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::vector<std::string> args(const std::string& seed) {
    // fp32: the microbatch test holds the fp32 pipeline tolerance.
    return {"--model", *dir_ / "model", "--prompt", "a lighthouse on a cliff", "--height", "64", "--width", "96",
            "--steps", "3", "--seed", seed, "--no-progress", "--dtype", "fp32"};
  }
  static TempDir* dir_;
};
TempDir* Pipelining::dir_ = nullptr;

std::string indexed(const std::string& stem, int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%05d.png", i);
  return stem + buf;
}

TEST_F(Pipelining, FourImagesOnTwoRanksEqualFourOneImageRuns) {
  auto many = args("10");
  many.insert(many.end(), {"--num-images", "4", "--checkpoint", *dir_ / "many.h5", "-o", *dir_ / "many-{i}.png"});
  JobResult r = run_fluxmpi(2, many);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<at::Tensor> rows;
  for (int i = 0; i < 4; ++i) {
    const std::string tag = "one" + std::to_string(i);
    auto one = args(std::to_string(10 + i));
    one.insert(one.end(), {"--checkpoint", *dir_ / (tag + ".h5"), "-o", *dir_ / (tag + ".png")});
    JobResult s = run_fluxmpi(1, one);
    ASSERT_EQ(s.exit_code, 0) << s.output;
    rows.push_back(all_latent_rows(*dir_ / (tag + ".h5")));
    EXPECT_TRUE(identical("image " + std::to_string(i) + " PNG pixels", png_pixels(*dir_ / indexed("many", i)),
                          png_pixels(*dir_ / (tag + ".png"))));
  }
  EXPECT_TRUE(identical("latents/steps of the 4-image job", all_latent_rows(*dir_ / "many.h5"), at::cat(rows, 0)));
}

TEST_F(Pipelining, MicrobatchesStayWithinTolerance) {
  auto a = args("20");
  a.insert(a.end(), {"--num-images", "3", "--checkpoint", *dir_ / "mb1.h5", "-o", *dir_ / "mb1-{i}.png"});
  auto b = args("20");
  b.insert(b.end(), {"--num-images", "3", "--microbatch", "2", "--checkpoint", *dir_ / "mb2.h5", "-o", *dir_ / "mb2-{i}.png"});
  JobResult ra = run_fluxmpi(2, a);
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  JobResult rb = run_fluxmpi(2, b);
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  EXPECT_TRUE(close_to("latents/steps, --microbatch 2 vs 1", all_latent_rows(*dir_ / "mb2.h5"),
                       all_latent_rows(*dir_ / "mb1.h5"), kTolPipelineFp32));
}

}  // namespace
}  // namespace fluxmpi::test
