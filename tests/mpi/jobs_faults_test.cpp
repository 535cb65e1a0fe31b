// Failures never hang a job (DESIGN.md §6): a rank that throws mid-run, a message whose header
// does not match what the receiver expects, a rank killed with SIGKILL, and a truncated shard read
// by rank 1 while loading each end the whole job promptly, non-zero, with the failing rank's
// report, and leave no rank running.

#include <gtest/gtest.h>

#include <dirent.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_reader.h"
#include "job_runner.h"

namespace fluxmpi::test {
namespace {
namespace fs = std::filesystem;

// fluxmpi processes whose command line mentions `needle` (a test's private temp dir).
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

class Faults : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("faults");
    // 2 double + 3 single blocks in 5 shards: some shard holds only single blocks.
    JobResult r = run_program(make_tiny_model_bin(), {"--out", *dir_ / "model", "--preset", "tiny", "--shards", "5"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  std::vector<std::string> args(const std::string& tag, const std::string& model = "") const {
    return {"--model", model.empty() ? *dir_ / "model" : model, "--prompt", "a red bicycle", "--height", "64", "--width", "64",
            "--steps", "4", "--seed", "3", "--no-progress", "--checkpoint", *dir_ / (tag + ".h5"), "-o", *dir_ / (tag + ".png")};
  }
  static TempDir* dir_;
};
TempDir* Faults::dir_ = nullptr;

TEST_F(Faults, RankThatThrowsMidRunEndsTheJob) {
  JobResult r = run_fluxmpi(2, args("throw"), kHangGuardSeconds, {"FLUXMPI_FAULT=throw@1:2"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("fluxmpi[rank 1/2]: InternalError: fault injected by FLUXMPI_FAULT at step 2"), std::string::npos) << r.output;
  EXPECT_EQ(r.hang, "") << r.output;  // ended by itself, not killed as hung
  EXPECT_EQ(processes_mentioning(*dir_ / "throw.h5"), 0) << "a rank is still running";
  EXPECT_FALSE(fs::exists(*dir_ / "throw.png")) << "no image of a failed run";
  // The checkpoint stays readable: steps 0 and 1 are in it.
  ckpt::CheckpointReader ck = ckpt::CheckpointReader::open(*dir_ / "throw.h5");
  EXPECT_EQ(ck.state(0).status, ckpt::ImageStatus::Denoising);
  EXPECT_GE(ck.state(0).last_step, 0);
}

TEST_F(Faults, RankZeroThatThrowsOnThreeRanks) {
  JobResult r = run_fluxmpi(3, args("throw0"), kHangGuardSeconds, {"FLUXMPI_FAULT=throw@0:1"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("fluxmpi[rank 0/3]: InternalError: fault injected"), std::string::npos) << r.output;
  EXPECT_EQ(r.hang, "") << r.output;  // ended by itself, not killed as hung
  EXPECT_EQ(processes_mentioning(*dir_ / "throw0.h5"), 0);
}

TEST_F(Faults, MismatchedHeaderIsACommErrorOnTheReceiver) {
  JobResult r = run_fluxmpi(2, args("header"), kHangGuardSeconds, {"FLUXMPI_FAULT=header@0:1"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("fluxmpi[rank 1/2]: CommError: rank 1 expected "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 1001"), std::string::npos) << "the received header is quoted:\n" << r.output;
  EXPECT_EQ(r.hang, "") << r.output;  // ended by itself, not killed as hung
}

TEST_F(Faults, KilledRankEndsTheJobAndLeavesAReadableCheckpoint) {
  JobResult r = run_fluxmpi(2, args("kill"), kHangGuardSeconds, {"FLUXMPI_FAULT=kill@1:2"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.hang, "") << r.output;  // ended by itself, not killed as hung
  EXPECT_EQ(processes_mentioning(*dir_ / "kill.h5"), 0) << "a rank is still running";
  ckpt::CheckpointReader ck = ckpt::CheckpointReader::open(*dir_ / "kill.h5");
  EXPECT_EQ(ck.state(0).status, ckpt::ImageStatus::Denoising);
  JobResult inspect = run_program(inspect_bin(), {*dir_ / "kill.h5"});
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("denoising"), std::string::npos) << inspect.output;
}

TEST_F(Faults, TruncatedShardReadByRankOne) {
  // A copy of the model whose shard holding only blocks of rank 1 is cut in half.
  const std::string model = *dir_ / "truncated-model";
  fs::copy(*dir_ / "model", model, fs::copy_options::recursive);
  std::ifstream in(model + "/transformer/diffusion_pytorch_model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  // A shard that rank 0 never reads (no embedder, no proj_out, nothing of block 0): rank 1 gets
  // every block from the first one in that shard on.
  const int64_t L = 2, B = 5;
  std::map<std::string, int64_t> first_block;  // shard -> smallest global block index, -1: rank 0 reads it
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    const std::string& key = it.key();
    int64_t block = -1;
    if (key.rfind("transformer_blocks.", 0) == 0) block = std::stoll(key.substr(19));
    else if (key.rfind("single_transformer_blocks.", 0) == 0) block = L + std::stoll(key.substr(26));
    else if (key.rfind("norm_out.", 0) == 0) block = B;
    const std::string shard = it.value().get<std::string>();
    auto [pos, fresh] = first_block.emplace(shard, block);
    if (block <= 0 || pos->second < 0) pos->second = -1;
    else if (!fresh) pos->second = std::min(pos->second, block);
  }
  std::string shard;
  int64_t cut = 0;
  for (const auto& [name, first] : first_block)
    if (first > 0 && first < B) {
      shard = name;
      cut = first;
    }
  ASSERT_FALSE(shard.empty()) << "every shard holds something rank 0 reads";
  const std::string path = model + "/transformer/" + shard;
  fs::resize_file(path, fs::file_size(path) / 2);
  auto a = args("truncated", model);
  a.insert(a.end(), {"--partition", "0:0-" + std::to_string(cut - 1) + ",1:" + std::to_string(cut) + "-" + std::to_string(B - 1)});
  JobResult r = run_fluxmpi(2, a);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("fluxmpi[rank 1/2]: WeightError: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(shard), std::string::npos) << "the message names the file:\n" << r.output;
  EXPECT_EQ(r.hang, "") << r.output;  // ended by itself, not killed as hung
  EXPECT_FALSE(fs::exists(*dir_ / "truncated.h5")) << "no checkpoint when loading fails";
  EXPECT_FALSE(fs::exists(*dir_ / "truncated.png"));
}

}  // namespace
}  // namespace fluxmpi::test
