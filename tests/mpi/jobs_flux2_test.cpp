// FLUX.2 jobs through the command line (docs/flux2.md): the same bits on 1, 2 and 3 ranks (klein,
// and klein base with its two passes per step); a dev job killed in the middle and resumed on
// other rank counts gives the uninterrupted run's latents and PNGs; fluxmpi-inspect --decode of
// the last row reproduces the PNG. Models: ../shared/fixtures/flux2; --threads 1, fp32.

#include <gtest/gtest.h>

#include <filesystem>

#include "ckpt/checkpoint_reader.h"
#include "job_runner.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

std::string fixture(const std::string& relative) { return (fs::path(fixture_root()) / "flux2" / relative).string(); }

class Flux2Jobs : public testing::Test {
 protected:
  void SetUp() override {
    FLUXMPI_REQUIRE_FIXTURES();
    if (!fs::exists(fixture("manifest.json"))) {
      if (running_in_ci()) FAIL() << "flux2 fixtures missing under " << fixture_root();
      GTEST_SKIP() << "flux2 fixtures missing";
    }
    dir_ = std::make_unique<TempDir>("flux2-jobs");
  }

  // Two images of `model`, 48x64, `steps` steps, 64 text tokens.
  std::vector<std::string> job(const std::string& tag, const std::string& model, const std::string& steps,
                               std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"--model", fixture(model), "--prompt", "a lighthouse on a cliff at dusk", "--num-images", "2",
                                  "--steps", steps, "--seed", "5", "--height", "48", "--width", "64", "--dtype", "fp32",
                                  "--no-progress", "--max-sequence-length", "64", "--checkpoint", path(tag + ".h5"), "-o",
                                  path(tag + "-{i}.png")};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string path(const std::string& name) const { return *dir_ / name; }

  void expect_same(const std::string& tag, const std::string& ref) {
    EXPECT_TRUE(identical(tag + ": latents/steps", all_latent_rows(path(tag + ".h5")), all_latent_rows(path(ref + ".h5"))));
    for (const char* i : {"-00000.png", "-00001.png"})
      EXPECT_TRUE(identical(tag + ": PNG " + i, png_pixels(path(tag + i)), png_pixels(path(ref + i))));
  }

  void same_on_every_rank_count(const std::string& tag, const std::string& model, std::vector<std::string> extra) {
    JobResult one = run_fluxmpi(1, job(tag + "1", model, "3", extra));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    for (int ranks : {2, 3}) {
      const std::string t = tag + std::to_string(ranks);
      JobResult r = run_fluxmpi(ranks, job(t, model, "3", extra));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      expect_same(t, tag + "1");
    }
  }

  std::unique_ptr<TempDir> dir_;
};

TEST_F(Flux2Jobs, KleinIsTheSameOnEveryRankCount) { same_on_every_rank_count("klein", "tiny-flux2-klein", {}); }

TEST_F(Flux2Jobs, KleinBaseTrueCfgIsTheSameOnEveryRankCount) {
  same_on_every_rank_count("base", "tiny-flux2-klein-base", {"--guidance", "3"});
  ckpt::CheckpointReader r = ckpt::CheckpointReader::open(path("base1.h5"));
  EXPECT_TRUE(r.shape(0).true_cfg);
  EXPECT_EQ(r.attributes(0).family, "flux2");
  EXPECT_EQ(r.text(0).negative_prompt_embeds.size(0), 64);
}

// Patch pipelining and micro-batches run FLUX.2 as they run FLUX.1: patches give the same bits on
// every rank count (the patch order alone decides which keys are fresh); --microbatch 2 batches
// the two images' calls and stays within kTolFp32 of one at a time.
TEST_F(Flux2Jobs, DevPatchesAndMicrobatches) {
  same_on_every_rank_count("patches", "tiny-flux2-dev", {"--patches", "2", "--warmup-steps", "1"});
  ASSERT_EQ(run_fluxmpi(1, job("exact", "tiny-flux2-dev", "3")).exit_code, 0);
  EXPECT_FALSE(all_latent_rows(path("patches1.h5")).equal(all_latent_rows(path("exact.h5"))))
      << "the pipelined steps use the previous step's keys/values";
  // A warm-up that covers every step is the exact run, bit for bit.
  ASSERT_EQ(run_fluxmpi(2, job("warm", "tiny-flux2-dev", "3", {"--patches", "2", "--warmup-steps", "3"})).exit_code, 0);
  EXPECT_TRUE(identical("--patches 2 --warmup-steps 3", all_latent_rows(path("warm.h5")), all_latent_rows(path("exact.h5"))));
  JobResult mb = run_fluxmpi(2, job("mb", "tiny-flux2-dev", "3", {"--microbatch", "2"}));
  ASSERT_EQ(mb.exit_code, 0) << mb.output;
  EXPECT_TRUE(close_to("--microbatch 2: latents/steps", all_latent_rows(path("mb.h5")), all_latent_rows(path("exact.h5")), kTolFp32));
}

TEST_F(Flux2Jobs, DevKilledThenResumedBitIdentical) {
  JobResult ref = run_fluxmpi(2, job("dev-ref", "tiny-flux2-dev", "4"));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  JobResult killed = run_fluxmpi(2, job("dev", "tiny-flux2-dev", "4"), kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:2"});
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_EQ(ckpt::CheckpointReader::open(path("dev.h5")).state(0).status, ckpt::ImageStatus::Denoising);
  for (int ranks : {1, 3}) {
    const std::string t = "dev-np" + std::to_string(ranks);
    fs::copy_file(path("dev.h5"), path(t + ".h5"));
    JobResult r = run_fluxmpi(ranks, {"--resume", path(t + ".h5"), "--no-progress", "-o", path(t + "-{i}.png")});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("encoded"), std::string::npos) << t << ": a resume must not encode again\n" << r.output;
    expect_same(t, "dev-ref");
  }
}

// A budget that holds the blocks but not the whole text encoder on rank 0 splits the encoder over
// the leading ranks for the encoding stage (parallel/text_split.h): the same embeddings and latents
// as one rank with the whole encoder. The tiny models' weights are a few MiB, so the budget sits just
// above the planner's runtime baseline (256 MiB): 258 MiB fits the blocks and half of the encoder.
TEST_F(Flux2Jobs, TextEncoderSplitOverRanksIsBitIdentical) {
  for (const char* model : {"tiny-flux2-dev"}) {
    const std::vector<std::string> cfg = {"--guidance", "3"};
    const std::string tag = std::string(model) == "tiny-flux2-dev" ? "split-dev" : "split-base";
    ASSERT_EQ(run_fluxmpi(1, job(tag + "1", model, "2", cfg)).exit_code, 0);
    for (int ranks : {2, 3}) {
      const std::string t = tag + std::to_string(ranks);
      auto args = job(t, model, "2", cfg);
      args.insert(args.end(), {"--max-memory", "258MiB"});
      JobResult r = run_fluxmpi(ranks, args);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("text encoder split over ranks: rank 0 layers 0-"), std::string::npos) << r.output;
      ckpt::CheckpointReader a = ckpt::CheckpointReader::open(path(t + ".h5"));
      ckpt::CheckpointReader b = ckpt::CheckpointReader::open(path(tag + "1.h5"));
      for (int64_t i = 0; i < 2; ++i) {
        EXPECT_TRUE(identical(t + ": prompt_embeds", a.text(i).prompt_embeds, b.text(i).prompt_embeds));
        if (b.shape(i).true_cfg)
          EXPECT_TRUE(identical(t + ": negative_prompt_embeds", a.text(i).negative_prompt_embeds, b.text(i).negative_prompt_embeds));
      }
      expect_same(t, tag + "1");
    }
  }
}

TEST_F(Flux2Jobs, InspectDecodesTheLastRowAsThePng) {
  JobResult r = run_fluxmpi(1, job("inspect", "tiny-flux2-dev", "2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  JobResult d = run_program(inspect_bin(), {path("inspect.h5"), "--image", "1", "--decode", path("decoded.png")});
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_TRUE(identical("inspect --decode", png_pixels(path("decoded.png")), png_pixels(path("inspect-00001.png"))));
}

}  // namespace
}  // namespace fluxmpi::test
