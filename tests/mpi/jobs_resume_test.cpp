// Checkpoints survive a killed job and resume to a bit-identical result (DESIGN.md §5): a rank is
// killed with SIGKILL in the middle of denoising (by the fault hook, and from outside while a
// step runs); an SWMR reader and fluxmpi-inspect open the file; `--resume` on 1, 2 or 3 ranks
// finishes the job with the same latents and PNG as an uninterrupted run.

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <regex>
#include <thread>

#include "ckpt/checkpoint_reader.h"
#include "core/error.h"
#include "job_runner.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

class Resume : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("resume");
    JobResult r = run_program(make_tiny_model_bin(), {"--out", *dir_ / "model", "--preset", "tiny"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // A model slow enough (~0.1-0.5 s a step) to be killed from outside in the middle of a step.
    r = run_program(make_tiny_model_bin(), {"--out", *dir_ / "slow", "--preset", "tiny", "--heads", "4", "--head-dim", "64",
                                            "--double", "2", "--single", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // The uninterrupted reference runs.
    auto ref = args("ref", "model", "6");
    JobResult done = run_fluxmpi(2, ref);
    ASSERT_EQ(done.exit_code, 0) << done.output;
    ASSERT_EQ(run_fluxmpi(2, args("slowref", "slow", "8", "256")).exit_code, 0);
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::vector<std::string> args(const std::string& tag, const std::string& model, const std::string& steps,
                                       const std::string& size = "64") {
    // fp32 pinned: the "slow" model's step time, which the external kill relies on, is an fp32 time.
    return {"--model", *dir_ / model, "--prompt", "an old stone bridge", "--num-images", "2", "--height", size, "--width", size,
            "--steps", steps, "--seed", "5", "--no-progress", "--dtype", "fp32", "--checkpoint", *dir_ / (tag + ".h5"),
            "-o", *dir_ / (tag + "-{i}.png")};
  }
  static std::vector<std::string> resume_args(const std::string& tag) {
    return {"--resume", *dir_ / (tag + ".h5"), "--no-progress", "-o", *dir_ / (tag + "-{i}.png")};
  }
  static void expect_same_as(const std::string& tag, const std::string& ref) {
    EXPECT_TRUE(identical(tag + ": latents/steps", all_latent_rows(*dir_ / (tag + ".h5")), all_latent_rows(*dir_ / (ref + ".h5"))));
    for (const char* i : {"-00000.png", "-00001.png"})
      EXPECT_TRUE(identical(tag + ": PNG " + i, png_pixels(*dir_ / (tag + i)), png_pixels(*dir_ / (ref + i))));
  }
  static TempDir* dir_;
};
TempDir* Resume::dir_ = nullptr;

TEST_F(Resume, KilledRankThenResumeOnEveryRankCount) {
  JobResult killed = run_fluxmpi(2, args("k", "model", "6"), kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:3"});
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_EQ(killed.hang, "") << killed.output;  // ended by itself
  {
    ckpt::CheckpointReader r = ckpt::CheckpointReader::open(*dir_ / "k.h5");  // SWMR reader on the killed file
    EXPECT_EQ(r.state(0).status, ckpt::ImageStatus::Denoising);
    EXPECT_GE(r.state(0).last_step, 1);
    EXPECT_LT(r.state(1).last_step, 5);
  }
  JobResult inspect = run_program(inspect_bin(), {*dir_ / "k.h5"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  for (int ranks : {1, 2, 3}) {
    const std::string tag = "k" + std::to_string(ranks);
    fs::copy_file(*dir_ / "k.h5", *dir_ / (tag + ".h5"));
    JobResult r = run_fluxmpi(ranks, resume_args(tag));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same_as(tag, "ref");
  }
}

TEST_F(Resume, SparseRowsResumeFromTheLastSavedStep) {
  auto a = args("sparse", "model", "6");
  a.insert(a.end(), {"--checkpoint-every", "2"});
  JobResult killed = run_fluxmpi(2, a, kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:5"});
  ASSERT_NE(killed.exit_code, 0);
  {
    ckpt::CheckpointReader r = ckpt::CheckpointReader::open(*dir_ / "sparse.h5");
    EXPECT_EQ(r.step_indices(0), (std::vector<int64_t>{1, 3}));
  }
  auto again = resume_args("sparse");  // --checkpoint-every is not stored: it is given again
  again.insert(again.end(), {"--checkpoint-every", "2"});
  JobResult r = run_fluxmpi(2, again);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ckpt::CheckpointReader done = ckpt::CheckpointReader::open(*dir_ / "sparse.h5");
  EXPECT_EQ(done.step_indices(0), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_TRUE(identical("final latents", done.latest_latents(1),
                        ckpt::CheckpointReader::open(*dir_ / "ref.h5").latest_latents(1)));
}

// Rank 1 of a running job killed from outside while a step computes.
TEST_F(Resume, ExternalSigkillInTheMiddleOfAStep) {
  auto a = args("ext", "slow", "8", "256");
  const std::string log = *dir_ / "ext.log";
  const int launcher = start_fluxmpi(2, a, log);
  ASSERT_GT(launcher, 0);
  // Wait until two steps of image 0 are committed, then kill rank 1. Progress, not time: the wait
  // ends when the step is seen or the job ends; the only limit is a hang guard (nothing seen
  // changes for 5 minutes) that reports what was seen last.
  int victim = -1, status = 0;
  bool ended = false;
  std::string seen = "no checkpoint yet";
  auto changed_at = std::chrono::steady_clock::now();
  while (victim < 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (::waitpid(launcher, &status, WNOHANG) == launcher) {
      ended = true;
      break;
    }
    std::string now_seen = seen;
    try {
      if (fs::exists(*dir_ / "ext.h5")) {
        const int64_t last = ckpt::CheckpointReader::open(*dir_ / "ext.h5").state(0).last_step;
        now_seen = str_cat("image 0 at last_step ", last);
        if (last >= 1) {
          for (const auto& e : fs::directory_iterator("/proc")) {
            std::ifstream env(e.path() / "environ");
            std::string text((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
            std::ifstream cmd(e.path() / "cmdline");
            std::string line((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
            if (line.find(*dir_ / "ext.h5") != std::string::npos && line.find("mpirun") == std::string::npos &&
                text.find(std::string("OMPI_COMM_WORLD_RANK=1") + '\0') != std::string::npos)
              victim = std::stoi(e.path().filename());
          }
          if (victim < 0) now_seen += ", rank 1 not found in /proc";
        }
      }
    } catch (const std::exception& e) {
      now_seen = e.what();
    }
    if (now_seen != seen) {
      seen = now_seen;
      changed_at = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - changed_at > std::chrono::minutes(5)) {
      break;
    }
  }
  if (victim <= 0 && !ended) {
    ::kill(-launcher, SIGKILL);
    ::waitpid(launcher, &status, 0);
  }
  ASSERT_GT(victim, 0) << (ended ? "the job ended before rank 1 could be killed" : "no progress for 5 minutes")
                       << "; last seen: " << seen;
  // The job must end by itself once rank 1 is gone. This limit applies to a hang only and is
  // measured from the failure (the kill), not from the start of the job.
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(victim, SIGKILL);
  while (::waitpid(launcher, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - killed_at > std::chrono::seconds(60)) {
      ::kill(-launcher, SIGKILL);
      ::waitpid(launcher, &status, 0);
      FAIL() << "the job did not end within 60 s of rank 1's death";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(WIFEXITED(status) ? WEXITSTATUS(status) : 1, 0);
  ckpt::CheckpointReader r = ckpt::CheckpointReader::open(*dir_ / "ext.h5");
  EXPECT_NE(r.state(1).status, ckpt::ImageStatus::Decoded);
  auto resume = resume_args("ext");
  JobResult done = run_fluxmpi(1, resume);
  ASSERT_EQ(done.exit_code, 0) << done.output;
  expect_same_as("ext", "slowref");
}

// fluxmpi-inspect --follow started before the job begins follows the real job (2 ranks, 2 images)
// to its end: it waits for the checkpoint to appear, reports progress, and ends by itself with
// exit 0 once both images are decoded. Progress, not time: the job starts only once the tool says
// it is waiting; the waits have hang guards only.
TEST_F(Resume, InspectFollowStartedBeforeTheJobFollowsItToTheEnd) {
  const std::string ck = *dir_ / "followed.h5", log = *dir_ / "follow.log";
  const int follower = start_program(inspect_bin(), {ck, "--follow", "--interval", "0.05"}, log);
  ASSERT_GT(follower, 0);
  auto log_text = [&] {
    std::ifstream in(log);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto stop_follower = [&] {
    ::kill(-follower, SIGKILL);
    ::waitpid(follower, nullptr, 0);
  };
  const auto started = std::chrono::steady_clock::now();
  while (log_text().find("waiting: ") == std::string::npos) {
    if (::waitpid(follower, nullptr, WNOHANG) == follower) FAIL() << "the tool ended before the job began:\n" << log_text();
    if (std::chrono::steady_clock::now() - started > std::chrono::minutes(5)) {
      stop_follower();
      FAIL() << "the tool printed no 'waiting:' line in 5 minutes:\n" << log_text();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  JobResult job = run_fluxmpi(2, args("followed", "model", "6"));
  if (job.exit_code != 0) stop_follower();
  ASSERT_EQ(job.exit_code, 0) << job.output;
  JobResult f = wait_for_program(follower, log);
  EXPECT_EQ(f.exit_code, 0) << f.output;
  EXPECT_EQ(f.output.find("Error"), std::string::npos) << f.output;
  const size_t waiting = f.output.find("waiting: " + ck + ": no such file");
  const size_t done = f.output.find("done: 2 of 2 image(s) decoded");
  EXPECT_NE(waiting, std::string::npos) << f.output;
  EXPECT_NE(done, std::string::npos) << f.output;
  EXPECT_LT(waiting, done) << f.output;
  // Each image's last line before "done" says it is decoded.
  for (const char* group : {"/images/00000", "/images/00001"}) {
    const size_t last = f.output.rfind(group, done);
    ASSERT_NE(last, std::string::npos) << f.output;
    EXPECT_EQ(f.output.compare(last, std::strlen(group) + 8, std::string(group) + " decoded"), 0) << f.output;
  }
  expect_same_as("followed", "ref");  // watching changes nothing
}

TEST_F(Resume, RefusesAnotherJobsCheckpoint) {
  fs::copy_file(*dir_ / "ref.h5", *dir_ / "other.h5");
  auto a = resume_args("other");
  a.insert(a.end(), {"--seed", "6"});
  JobResult r = run_fluxmpi(1, a);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("'seed' is 5 in the checkpoint, the command line asks for 6"), std::string::npos) << r.output;
}

// Tiled VAE decoding changes the pixels, so the checkpoint records it: a resumed run decodes as
// the killed run would have (tiled without repeating --vae-tiling), and refuses a checkpoint made
// untiled when --vae-tiling is given. The tiny preset's VAE (sample_size 32) tiles a 64-px image.
TEST_F(Resume, KeepsTheVaeTilingOfTheCheckpoint) {
  auto tiled = [&](const std::string& tag) {
    auto a = args(tag, "model", "6");
    a.push_back("--vae-tiling");
    return a;
  };
  ASSERT_EQ(run_fluxmpi(2, tiled("tiledref")).exit_code, 0);
  JobResult killed = run_fluxmpi(2, tiled("tk"), 60, {"FLUXMPI_FAULT=kill@1:3"});
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_EQ(ckpt::CheckpointReader::open(*dir_ / "tk.h5").attributes(0).vae_tiling, 1);
  JobResult resumed = run_fluxmpi(2, resume_args("tk"), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_as("tk", "tiledref");
  EXPECT_FALSE(identical("tiled vs untiled PNG", png_pixels(*dir_ / "tiledref-00000.png"), png_pixels(*dir_ / "ref-00000.png")));

  fs::copy_file(*dir_ / "ref.h5", *dir_ / "untiled.h5");
  auto a = resume_args("untiled");
  a.push_back("--vae-tiling");
  JobResult refused = run_fluxmpi(1, a, 60);
  EXPECT_EQ(refused.exit_code, 3) << refused.output;
  EXPECT_NE(refused.output.find("/images/00000: 'vae_tiling' is 0 in the checkpoint, the command line asks for 1"),
            std::string::npos)
      << refused.output;
}

// Without --dtype the run resolves "auto" once, logs the choice and stores the dtype it used; a
// resume without --dtype takes the stored one, `--dtype auto` resolves to the same on this machine,
// and the other dtype is refused as another job's.
TEST_F(Resume, AutoDtypeIsStoredResolvedAndComparedOnResume) {
  auto a = args("auto", "model", "2");
  a.erase(std::find(a.begin(), a.end(), "--dtype"), std::find(a.begin(), a.end(), "--dtype") + 2);
  JobResult r = run_fluxmpi(1, a, 120, {"FLUXMPI_FAULT=kill@0:1"});
  ASSERT_NE(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("--dtype auto chose (fp32|bf16): "))) << r.output;
  const std::string chosen = m[1].str(), other = chosen == "bf16" ? "fp32" : "bf16";
  EXPECT_EQ(ckpt::CheckpointReader::open(*dir_ / "auto.h5").attributes(0).dtype, chosen);

  fs::copy_file(*dir_ / "auto.h5", *dir_ / "auto-other.h5");
  auto refused = resume_args("auto-other");
  refused.insert(refused.end(), {"--dtype", other});
  r = run_fluxmpi(1, refused, 60);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("'dtype' is \"" + chosen + "\" in the checkpoint, the command line asks for \"" + other + "\""),
            std::string::npos)
      << r.output;

  auto again = resume_args("auto");
  again.insert(again.end(), {"--dtype", "auto"});
  r = run_fluxmpi(2, again);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ckpt::CheckpointReader done = ckpt::CheckpointReader::open(*dir_ / "auto.h5");
  EXPECT_EQ(done.attributes(0).dtype, chosen);
  EXPECT_EQ(done.state(0).status, ckpt::ImageStatus::Decoded);
}

TEST_F(Resume, AFinishedCheckpointHasNothingLeft) {
  fs::copy_file(*dir_ / "ref.h5", *dir_ / "finished.h5");
  JobResult r = run_fluxmpi(2, resume_args("finished"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(*dir_ / "finished-00000.png")) << "decoded images are not made again";
}

}  // namespace
}  // namespace fluxmpi::test
