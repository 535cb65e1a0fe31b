// `mpirun -np 2 fluxmpi --dry-run --predict tools/sim/profiles/local-cpu.json` on the benchmark
// model (make-tiny-model --preset bench, the model local-cpu.json was calibrated on): the printed
// prediction is exactly what tools/sim/fluxsim.py prints when run directly with the job's options,
// for one pipeline of 2 ranks and for --stages 2 on 4 ranks.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "job_runner.h"
#include "support/fixtures.h"
#include "support/simulator.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

TEST(PredictJob, TwoRanksOnTheBenchModelPrintTheSimulatorsPrediction) {
  TempDir dir("predict");
  JobResult made = run_program(make_tiny_model_bin(), {"--out", dir / "bench", "--preset", "bench", "--dtype", "bf16"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string profile = sim_dir() + "/profiles/local-cpu.json";
  // 2 prompts x 2 images at 256^2 (a 32-cell latent: 121 tiles of the tiny VAE's 4 cells), tiled
  // over both ranks, --patches 2, microbatch 2, a checkpoint kept every 2 steps.
  JobResult r = run_fluxmpi(2, {"--model", dir / "bench", "--dry-run", "--prompt", "a quiet street", "--num-images", "4",
                                "--height", "256", "--width", "256", "--steps", "6", "--max-sequence-length", "128",
                                "--microbatch", "2", "--patches", "2", "--warmup-steps", "2", "--vae-tiling",
                                "--partition", "0:0-5,1:6-11", "--checkpoint", dir / "run.h5", "--checkpoint-every", "2",
                                "--predict", profile});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string expected =
      run_simulator({"--profile", profile, "--ranks", "2", "--partition", "0:0-5,1:6-11", "--microbatch", "2", "--patches",
                     "2", "--warmup", "2", "--images", "4", "--prompts", "1", "--steps", "6", "--height", "256", "--width",
                     "256", "--max-sequence-length", "128", "--checkpoint", "--checkpoint-every", "2", "--vae-tiling",
                     "--decode-ranks", "2", "--vae-tile", "4", "--vae-scale", "8", "--expect-transformer", "4,8,6,128"});
  ASSERT_NE(expected.find("images/hour"), std::string::npos) << expected;
  EXPECT_NE(expected.find("121 tiles over 2 rank(s)"), std::string::npos) << expected;
  const size_t at = r.output.find("prediction (python3 ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t body = r.output.find('\n', at) + 1;
  EXPECT_EQ(r.output.substr(body, expected.size()), expected) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run.h5"));  // a dry run writes nothing
}

// --stages 2 on 4 ranks: two pipelines of the same 2-rank plan, each decoding its images' tiles
// over its own 2 ranks; fluxsim.py gets --ranks 4 --stages 2 and the one pipeline's partition.
TEST(PredictJob, TwoPipelinesOfTwoRanksPrintTheSimulatorsPrediction) {
  TempDir dir("predict-stages");
  JobResult made = run_program(make_tiny_model_bin(), {"--out", dir / "bench", "--preset", "bench", "--dtype", "bf16"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string profile = sim_dir() + "/profiles/local-cpu.json";
  JobResult r = run_fluxmpi(4, {"--model", dir / "bench", "--dry-run", "--stages", "2", "--prompt", "a quiet street",
                                "--num-images", "8", "--height", "256", "--width", "256", "--steps", "4",
                                "--max-sequence-length", "128", "--vae-tiling", "--partition", "0:0-5,1:6-11", "--checkpoint",
                                dir / "run.h5", "--predict", profile});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string expected =
      run_simulator({"--profile", profile, "--ranks", "4", "--stages", "2", "--partition", "0:0-5,1:6-11", "--microbatch",
                     "1", "--patches", "1", "--warmup", "1", "--images", "8", "--prompts", "1", "--steps", "4", "--height",
                     "256", "--width", "256", "--max-sequence-length", "128", "--checkpoint", "--checkpoint-every", "1",
                     "--vae-tiling", "--decode-ranks", "2", "--vae-tile", "4", "--vae-scale", "8", "--expect-transformer",
                     "4,8,6,128"});
  ASSERT_NE(expected.find("images/hour"), std::string::npos) << expected;
  EXPECT_NE(expected.find("4 ranks = 2 pipeline(s) x 2 stages"), std::string::npos) << expected;
  EXPECT_NE(expected.find("121 tiles over 2 rank(s)"), std::string::npos) << expected;
  const size_t at = r.output.find("prediction (python3 ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t body = r.output.find('\n', at) + 1;
  EXPECT_EQ(r.output.substr(body, expected.size()), expected) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run.h5"));
}

}  // namespace
}  // namespace fluxmpi::test
