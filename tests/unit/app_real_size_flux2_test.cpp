// FLUX.2 at real size without the weights: hollow FLUX.2 [dev], [klein] 4B and 9B folders (the
// shipped configs, weight headers with the real names and shapes over file holes;
// tests/support/hollow_flux2.h) through the validation of `fluxmpi --dry-run`: parameter counts
// from the headers, the plans on 1 and 2 ranks for klein and on 4 and 8 ranks for dev, the text
// encoder stage (only the layers used), and budgets.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "app/prepare.h"
#include "core/error.h"
#include "core/units.h"
#include "io/flux2_configs.h"
#include "parallel/partition.h"
#include "support/fixtures.h"
#include "support/hollow_flux2.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;

constexpr uint64_t kGiB = 1ull << 30;

class RealSizeFlux2 : public testing::Test {
 protected:
  // $FLUXMPI_HOLLOW_DIR keeps the folders (e.g. to run fluxmpi --dry-run on them by hand).
  static void SetUpTestSuite() {
    const char* keep = std::getenv("FLUXMPI_HOLLOW_DIR");
    keep_ = keep != nullptr && *keep != '\0';
    root_ = keep_ ? fs::path(keep) : fs::temp_directory_path() / ("fluxmpi-real-size-flux2-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    if (!fs::is_directory(fs::path(test::fixture_root()) / "flux2")) return;  // the tokenizers come from there
    for (const char* m : {"FLUX.2-dev", "FLUX.2-klein-4B", "FLUX.2-klein-9B"})
      models_[m] = test::write_hollow_flux2_model(m, (root_ / m).string());
  }
  static void TearDownTestSuite() {
    if (!keep_) fs::remove_all(root_);
  }
  void SetUp() override {
    if (models_.size() != 3) {
      const std::string why = "flux2 fixtures (their tokenizers) not found under '" + test::fixture_root() + "'";
      if (test::running_in_ci()) FAIL() << why;
      GTEST_SKIP() << why;
    }
  }
  static std::string model(const std::string& m) { return models_.at(m).root; }

  static bool keep_;
  static fs::path root_;
  static std::map<std::string, test::HollowModel> models_;
};
bool RealSizeFlux2::keep_ = false;
fs::path RealSizeFlux2::root_;
std::map<std::string, test::HollowModel> RealSizeFlux2::models_;

Preparation dry_run(const std::string& model, int ranks, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--model", model, "--dry-run", "--dtype", "bf16"};
  args.insert(args.end(), extra.begin(), extra.end());
  return prepare_run(args, ranks);
}

TEST_F(RealSizeFlux2, ParameterCountsFromTheHeaders) {
  // The modules built from the shipped configs hold the published sizes: [dev] 32 B, klein 4 B, 9 B.
  EXPECT_EQ(models_.at("FLUX.2-dev").written.at("transformer").elements, 32'223'281'152);
  EXPECT_EQ(models_.at("FLUX.2-klein-4B").written.at("transformer").elements, 3'875'544'576);
  EXPECT_EQ(models_.at("FLUX.2-klein-9B").written.at("transformer").elements, 9'078'581'248);
  // ... and the planner's formula agrees with every header.
  for (const auto& [name, m] : models_)
    EXPECT_EQ(parallel::flux2_family_costs(io::ModelDir(m.root).flux2_transformer_config()).params.total,
              m.written.at("transformer").elements)
        << name;
}

TEST_F(RealSizeFlux2, KleinOnOneAndTwoRanksOf24GiB) {
  for (int ranks : {1, 2}) {
    const Preparation p = dry_run(model("FLUX.2-klein-4B"), ranks, {"--max-memory", "24GiB"});
    ASSERT_TRUE(p.dry_run_plan.has_value());
    EXPECT_NE(p.output.find("(FLUX.2 [klein])"), std::string::npos) << p.output;
    EXPECT_NE(p.output.find("4 steps"), std::string::npos) << p.output;
    uint64_t weights = 0;
    for (int r = 0; r < ranks; ++r) {
      EXPECT_LE(p.dry_run_plan->estimate(r).peak_bytes, 24 * kGiB) << "rank " << r << "\n" << p.output;
      weights += p.dry_run_plan->estimate(r).weight_bytes;
    }
    EXPECT_EQ(weights, 2ull * 3'875'544'576) << p.output;
  }
}

TEST_F(RealSizeFlux2, TheTextEncoderStageHoldsTheLayersUsedOnly) {
  // klein: hidden states 9, 18, 27 -> 27 of Qwen3-4B's 36 layers, no final norm, no lm_head.
  const Preparation p = dry_run(model("FLUX.2-klein-4B"), 1);
  const io::LlmShape q = io::parse_llm_shape(io::ModelDir(model("FLUX.2-klein-4B")).read_config("text_encoder/config.json"));
  const uint64_t weights = 2ull * static_cast<uint64_t>(q.params(27, false));
  const uint64_t encode = p.dry_run_plan->estimate(0).encode_bytes;
  EXPECT_GT(encode, weights);
  EXPECT_LT(encode, 2ull * static_cast<uint64_t>(q.params(36, true)));
}

TEST_F(RealSizeFlux2, DevOnEightRanksOf16GiBSplitsTheBlocksAndTheTextEncoder) {
  // 64 GB of blocks over 8 ranks; the 30 Mistral layers used (34.7 GB) over the first 3 while encoding.
  const Preparation p = dry_run(model("FLUX.2-dev"), 8, {"--max-memory", "16GiB"});
  ASSERT_TRUE(p.dry_run_plan.has_value());
  EXPECT_NE(p.output.find("(FLUX.2 [dev])"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("50 steps, guidance 4"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("split over 3 ranks while encoding"), std::string::npos) << p.output;
  for (int r = 0; r < 8; ++r) EXPECT_LE(p.dry_run_plan->estimate(r).peak_bytes, 16 * kGiB) << "rank " << r << "\n" << p.output;
}

TEST_F(RealSizeFlux2, DevFitsFourRanksOf24GiBWithTheTextEncoderSplit) {
  // 30 of Mistral's 40 layers (34.7 GB in bf16) do not fit rank 0: the encoder runs over ranks 0-1
  // for the encoding stage; the 64 GB of blocks over all four.
  const Preparation p = dry_run(model("FLUX.2-dev"), 4, {"--max-memory", "24GiB"});
  ASSERT_TRUE(p.dry_run_plan.has_value());
  EXPECT_NE(p.output.find("text encoder: layers 0-14 on rank 0"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("15-29 on rank 1"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("split over 2 ranks while encoding"), std::string::npos) << p.output;
  uint64_t weights = 0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_LE(p.dry_run_plan->estimate(r).peak_bytes, 24 * kGiB) << "rank " << r << "\n" << p.output;
    weights += p.dry_run_plan->estimate(r).weight_bytes;
  }
  EXPECT_EQ(weights, 2ull * 32'223'281'152);
}

TEST_F(RealSizeFlux2, AnImpossibleBudgetIsOneLine) {
  std::string message;
  try {
    dry_run(model("FLUX.2-dev"), 2, {"--max-memory", "8GiB"});
  } catch (const UsageError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("--max-memory"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

}  // namespace
}  // namespace fluxmpi::app
