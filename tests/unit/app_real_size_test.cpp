// Real-size runs without the weights: hollow FLUX.1-dev and FLUX.1-schnell folders (the published
// configs, the real tokenizers, weight headers with the real names and shapes over file holes;
// tests/support/hollow_model.h) through the validation of `fluxmpi --dry-run`: parameter counts,
// the plans on 1, 2, 4 and 8 ranks in fp32 and bf16 under both balances, budgets (one for every
// rank, Slurm units, VAE tiling switched on for a budget, the messages when nothing fits), the
// job summary, and broken downloads.

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "app/prepare.h"
#include "core/error.h"
#include "core/units.h"
#include "io/model_dir.h"
#include "parallel/partition.h"
#include "support/fixtures.h"
#include "support/hollow_model.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;

constexpr uint64_t kGiB = 1ull << 30;

// The published sizes (FLUX.1-dev model card and transformers' configs).
constexpr int64_t kDevTransformerParams = 11901408320;
constexpr int64_t kSchnellTransformerParams = 11891178560;  // no guidance embedder
constexpr int64_t kT5Params = 4762310656;
constexpr int64_t kClipParams = 123060480;

// Both hollow pipelines, written once for the whole test program.
class RealSize : public testing::Test {
 protected:
  // $FLUXMPI_HOLLOW_DIR keeps the folders (e.g. to run fluxmpi --dry-run on them by hand).
  static void SetUpTestSuite() {
    const char* keep = std::getenv("FLUXMPI_HOLLOW_DIR");
    keep_ = keep != nullptr && *keep != '\0';
    root_ = keep_ ? fs::path(keep) : fs::temp_directory_path() / ("fluxmpi-real-size-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    for (const char* variant : {"FLUX.1-dev", "FLUX.1-schnell"})
      if (fs::is_directory(fs::path(test::assets_root()) / "configs" / variant))
        models_[variant] = test::write_hollow_model(variant, (root_ / variant).string());
  }
  static void TearDownTestSuite() {
    if (!keep_) fs::remove_all(root_);
  }

  void SetUp() override {
    if (models_.size() != 2) {
      const std::string why = "real FLUX configs not found under '" + test::assets_root() + "/configs'";
      if (test::running_in_ci()) FAIL() << why;
      GTEST_SKIP() << why;
    }
  }

  static std::string model(const std::string& variant) { return models_.at(variant).root; }

  // A broken copy of `variant` (a fresh hollow folder) for tests that damage files.
  std::string scratch(const std::string& variant) {
    const fs::path dir = root_ / ("scratch-" + std::to_string(counter_++));
    return test::write_hollow_model(variant, dir.string()).root;
  }

  static fs::path root_;
  static bool keep_;
  static std::map<std::string, test::HollowModel> models_;
  static int counter_;
};
fs::path RealSize::root_;
bool RealSize::keep_ = false;
std::map<std::string, test::HollowModel> RealSize::models_;
int RealSize::counter_ = 0;

Preparation dry_run(const std::string& model, int ranks, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--model", model, "--dry-run"};
  args.insert(args.end(), extra.begin(), extra.end());
  return prepare_run(args, ranks);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- parameter counts from the headers --------------------------------------------------------

TEST_F(RealSize, ParameterCountsAreThePublishedOnes) {
  const auto& dev = models_.at("FLUX.1-dev").written;
  const auto& schnell = models_.at("FLUX.1-schnell").written;
  EXPECT_EQ(dev.at("transformer").elements, kDevTransformerParams);
  EXPECT_EQ(schnell.at("transformer").elements, kSchnellTransformerParams);
  for (const auto* m : {&dev, &schnell}) {
    EXPECT_EQ(m->at("text_encoder_2").elements, kT5Params);
    EXPECT_EQ(m->at("text_encoder").elements, kClipParams);
    // 49.5 M: the decoder of AutoencoderKL at FLUX size (the encoder is not run, not written).
    EXPECT_NEAR(static_cast<double>(m->at("vae").elements) / 1e6, 49.5, 0.05) << m->at("vae").elements;
    EXPECT_EQ(m->at("text_encoder_2").tensors, 219);  // the published T5 index's tensor count
  }
  // The same counts by formula from the configs, as the planner uses them.
  io::ModelDir dir(model("FLUX.1-dev"));
  EXPECT_EQ(parallel::count_transformer_params(dir.transformer_config()).total, kDevTransformerParams);
  EXPECT_EQ(parallel::count_t5_encoder_params(dir.t5_config()), kT5Params);
  EXPECT_EQ(parallel::count_clip_text_params(dir.clip_config()), kClipParams);
  EXPECT_EQ(parallel::count_vae_decoder_params(dir.vae_config()), dev.at("vae").elements);
}

TEST_F(RealSize, TransformerKeysAreThePublishedIndex) {
  // Every key of FLUX.1-dev's published weight index is a parameter of the modules, and back.
  const fs::path published = fs::path(test::assets_root()) / "configs/FLUX.1-dev/transformer" /
                             "diffusion_pytorch_model.safetensors.index.json";
  nlohmann::json index = nlohmann::json::parse(std::ifstream(published));
  EXPECT_EQ(static_cast<int64_t>(index.at("weight_map").size()), models_.at("FLUX.1-dev").written.at("transformer").tensors);
  EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), kDevTransformerParams * 2);
}

// ---- plans on 1, 2, 4, 8 ranks ----------------------------------------------------------------

struct PlanCase {
  std::string variant;
  int ranks;
  std::string dtype;
};

class RealSizePlans : public RealSize, public testing::WithParamInterface<PlanCase> {};

TEST_P(RealSizePlans, ComputeSharesAreWithinOneBlockOfEven) {
  const PlanCase& p = GetParam();
  Preparation prep = dry_run(model(p.variant), p.ranks, {"--dtype", p.dtype, "--balance", "compute"});
  ASSERT_TRUE(prep.dry_run_plan);
  const parallel::StagePlan& plan = *prep.dry_run_plan;
  SCOPED_TRACE(prep.output);
  const int64_t B = plan.num_blocks();
  const double block_share = 1.0 / static_cast<double>(B);
  for (int r = 0; r < p.ranks; ++r) {
    EXPECT_LE(std::abs(plan.estimate(r).flops_share - 1.0 / p.ranks), block_share) << "rank " << r;
    // 57 blocks: every rank floor(57/P) or ceil(57/P) blocks (7-8 on 8 ranks).
    EXPECT_GE(plan.blocks(r).count(), B / p.ranks) << "rank " << r;
    EXPECT_LE(plan.blocks(r).count(), (B + p.ranks - 1) / p.ranks) << "rank " << r;
  }
}

TEST_P(RealSizePlans, MemoryPeaksSpreadNoMoreThanOneBlockPlusRankZerosStages) {
  const PlanCase& p = GetParam();
  Preparation prep = dry_run(model(p.variant), p.ranks, {"--dtype", p.dtype, "--balance", "memory"});
  ASSERT_TRUE(prep.dry_run_plan);
  const parallel::StagePlan& plan = *prep.dry_run_plan;
  SCOPED_TRACE(prep.output);
  const int64_t b = p.dtype == "bf16" ? 2 : 4;
  const uint64_t block = static_cast<uint64_t>(plan.params().double_block * b);
  const uint64_t final_layer = static_cast<uint64_t>(plan.params().final_layer * b);
  const uint64_t embedders = static_cast<uint64_t>(plan.params().embedders * b);
  // Ranks 1..P-1: within one block (and the last rank's final layer) of each other.
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int r = 1; r < p.ranks; ++r) {
    lo = std::min(lo, plan.estimate(r).peak_bytes);
    hi = std::max(hi, plan.estimate(r).peak_bytes);
  }
  if (p.ranks > 2) EXPECT_LE(hi - lo, block + final_layer) << format_bytes(hi - lo);
  // Rank 0: above the others by no more than one block plus what only rank 0 holds (its encode
  // stage, or the embedders, job buffers and VAE of its decode stage).
  const parallel::StageEstimate& e0 = plan.estimate(0);
  if (p.ranks > 1) {
    const uint64_t decode_extra = e0.decode_bytes - e0.denoise_bytes + embedders + e0.job_bytes;
    EXPECT_LE(e0.peak_bytes, std::max(e0.encode_bytes, hi + block + decode_extra)) << format_bytes(e0.peak_bytes);
    EXPECT_GE(e0.peak_bytes + block + final_layer, lo) << "rank 0 is not left light";
  }
}

std::vector<PlanCase> plan_cases() {
  std::vector<PlanCase> out;
  for (const char* v : {"FLUX.1-dev", "FLUX.1-schnell"})
    for (int P : {1, 2, 4, 8})
      for (const char* d : {"fp32", "bf16"}) out.push_back({v, P, d});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Variants, RealSizePlans, testing::ValuesIn(plan_cases()),
                         [](const testing::TestParamInfo<PlanCase>& info) {
                           std::string v = info.param.variant == "FLUX.1-dev" ? "dev" : "schnell";
                           return str_cat(v, "_P", info.param.ranks, "_", info.param.dtype);
                         });

// ---- budgets and VAE tiling ------------------------------------------------------------------

TEST_F(RealSize, OneBudgetForEveryRankInSlurmUnits) {
  for (const char* text : {"16GiB", "16G", "16gib", "16g"}) {
    Preparation prep = dry_run(model("FLUX.1-dev"), 4, {"--dtype", "bf16", "--max-memory", text});
    ASSERT_TRUE(prep.dry_run_plan) << text;
    for (int r = 0; r < 4; ++r) EXPECT_LE(prep.dry_run_plan->estimate(r).peak_bytes, 16 * kGiB) << text;
    EXPECT_NE(prep.output.find("16.0 GiB"), std::string::npos) << prep.output;
  }
  EXPECT_EQ(parse_bytes("500M", "x"), 500ull << 20);
  EXPECT_EQ(parse_bytes("2gb", "x"), 2000000000ull);
  EXPECT_EQ(parallel::parse_max_memory("16GiB,0=20GiB", 3),
            (std::map<int, uint64_t>{{0, 20 * kGiB}, {1, 16 * kGiB}, {2, 16 * kGiB}}));
}

TEST_F(RealSize, TilingIsSwitchedOnWhenTheBudgetNeedsIt) {
  // 2048 x 2048 on 8 ranks, 12 GiB each in bf16 (24 GiB in fp32, where the text encoders alone
  // take 18.8 GiB): rank 0's balanced slice (8 double blocks) and the untiled decode (8.5 GiB of
  // VAE activations in bf16, 16.5 GiB in fp32) exceed rank 0's budget, so untiled rank 0 would
  // have to take fewer blocks; decoding in 1024-pixel tiles keeps the balanced plan.
  for (const auto& [dtype, limit] : {std::pair<const char*, uint64_t>{"bf16", 12}, {"fp32", 24}}) {
    const std::string limit_text = str_cat(limit, "GiB");
    const std::vector<std::string> job = {"--dtype", dtype, "--height", "2048", "--width", "2048"};
    Preparation free = dry_run(model("FLUX.1-dev"), 8, job);
    ASSERT_TRUE(free.dry_run_plan);
    EXPECT_FALSE(free.dry_run_plan->vae_tiling());
    EXPECT_GT(free.dry_run_plan->estimate(0).decode_bytes, limit * kGiB) << free.output;

    std::vector<std::string> budget = job;
    budget.insert(budget.end(), {"--max-memory", limit_text});
    Preparation fit = dry_run(model("FLUX.1-dev"), 8, budget);
    ASSERT_TRUE(fit.dry_run_plan);
    SCOPED_TRACE(fit.output);
    EXPECT_TRUE(fit.dry_run_plan->vae_tiling());
    EXPECT_TRUE(fit.dry_run_plan->vae_tiling_auto());
    for (int r = 0; r < 8; ++r) EXPECT_LE(fit.dry_run_plan->estimate(r).peak_bytes, limit * kGiB) << "rank " << r;
    EXPECT_NE(fit.output.find("tiled: 9 tiles, switched on to fit the budget"), std::string::npos);
    EXPECT_NE(fit.output.find("VAE tiled"), std::string::npos);

    // Asked for: the same tiles, and the peak saved is the difference of the decode stages.
    budget = job;
    budget.push_back("--vae-tiling");
    Preparation asked = dry_run(model("FLUX.1-dev"), 8, budget);
    EXPECT_TRUE(asked.dry_run_plan->vae_tiling());
    EXPECT_FALSE(asked.dry_run_plan->vae_tiling_auto());
    // (Rank 0's slice may differ between the two plans: compare the decode stage without it.)
    auto vae_part = [](const parallel::StageEstimate& e) { return e.decode_bytes - e.weight_bytes; };
    EXPECT_LT(vae_part(asked.dry_run_plan->estimate(0)), vae_part(free.dry_run_plan->estimate(0)) / 2);
  }
  // 16 GiB in bf16 fits 2048 x 2048 untiled as well: nothing to switch on.
  Preparation roomy = dry_run(model("FLUX.1-dev"), 8, {"--dtype", "bf16", "--height", "2048", "--width", "2048",
                                                       "--max-memory", "16G"});
  EXPECT_FALSE(roomy.dry_run_plan->vae_tiling()) << roomy.output;
  for (int r = 0; r < 8; ++r) EXPECT_LE(roomy.dry_run_plan->estimate(r).peak_bytes, 16 * kGiB) << "rank " << r;
  // At 1024 x 1024 the latent is one tile: tiling changes nothing and stays off.
  Preparation small = dry_run(model("FLUX.1-dev"), 2, {"--vae-tiling"});
  EXPECT_FALSE(small.dry_run_plan->vae_tiling());
}

TEST_F(RealSize, TooSmallBudgetsNameTheStage) {
  // 1 rank, bf16: all 57 blocks; no advice to use a smaller dtype.
  std::string msg = error_of([&] { dry_run(model("FLUX.1-dev"), 1, {"--dtype", "bf16", "--max-memory", "20GiB"}); });
  EXPECT_NE(msg.find("--max-memory: rank 0 denoise: "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" > 20.0 GiB"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("--dtype"), std::string::npos) << msg;
  // fp32 suggests bf16.
  msg = error_of([&] { dry_run(model("FLUX.1-dev"), 1, {"--dtype", "fp32", "--max-memory", "40GiB"}); });
  EXPECT_NE(msg.find("or use --dtype bf16"), std::string::npos) << msg;
  // Rank 0's budget below its encode stage: the stage, its weights, no --dtype advice in bf16.
  msg = error_of([&] {
    dry_run(model("FLUX.1-dev"), 8, {"--dtype", "bf16", "--height", "2048", "--width", "2048", "--max-memory", "0=6GiB"});
  });
  EXPECT_NE(msg.find("--max-memory: rank 0 encode: 9.5 GiB (text encoders 9.1 GiB in bf16) > 6.0 GiB"), std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("--dtype"), std::string::npos) << msg;
  // On 1 rank the plan says so in the singular.
  Preparation one = dry_run(model("FLUX.1-schnell"), 1, {"--dtype", "bf16"});
  EXPECT_NE(one.output.find("balance compute on 1 rank;"), std::string::npos) << one.output;
}

TEST_F(RealSize, DecodeStageOverTheBudgetIsNamed) {
  // 1 rank in bf16, 1024 x 1024: all 57 blocks fit 24 GiB while denoising, not while decoding
  // (one tile: tiling would change nothing, so it is not suggested).
  const std::string msg =
      error_of([&] { dry_run(model("FLUX.1-dev"), 1, {"--dtype", "bf16", "--max-memory", "24GiB"}); });
  EXPECT_NE(msg.find("--max-memory: rank 0 decode: 25.0 GiB (VAE activations 2.5 GiB) > 24.0 GiB; raise the budget or make "
                     "smaller images"),
            std::string::npos)
      << msg;
}

// ---- the job above the table ----------------------------------------------------------------

TEST_F(RealSize, DryRunPrintsTheJob) {
  Preparation base = dry_run(model("FLUX.1-dev"), 2, {"--dtype", "bf16", "--prompt", "a cat"});
  EXPECT_NE(base.output.find("job: 1 prompt x 1 image = 1 image, 1024x1024 pixels (latent 128x128, 4096 image tokens), "
                             "28 steps, guidance 3.5, 512 T5 tokens + 77 CLIP tokens, dtype bf16, microbatch 1"),
            std::string::npos)
      << base.output;
  EXPECT_LT(base.output.find("job: "), base.output.find("rank  blocks")) << base.output;
  Preparation schnell = dry_run(model("FLUX.1-schnell"), 2, {"--dtype", "bf16"});
  EXPECT_NE(schnell.output.find("4 steps, 256 T5 tokens"), std::string::npos) << schnell.output;

  // More images: more buffers on rank 0; a larger microbatch: more activations on every rank.
  Preparation images = dry_run(model("FLUX.1-dev"), 2, {"--dtype", "bf16", "--prompt", "a cat", "--num-images", "8"});
  EXPECT_NE(images.output.find("rank 0 buffers: 8 images x"), std::string::npos) << images.output;
  EXPECT_GT(images.dry_run_plan->estimate(0).job_bytes, base.dry_run_plan->estimate(0).job_bytes);
  Preparation micro = dry_run(model("FLUX.1-dev"), 2, {"--dtype", "bf16", "--prompt", "a cat", "--microbatch", "2"});
  EXPECT_GT(micro.dry_run_plan->estimate(1).activation_bytes, base.dry_run_plan->estimate(1).activation_bytes);
  EXPECT_NE(micro.output.find("microbatch 2"), std::string::npos);
  EXPECT_NE(micro.output, base.output);
}

// ---- broken downloads fail --dry-run ----------------------------------------------------------

TEST_F(RealSize, DryRunChecksEveryComponent) {
  EXPECT_EQ(dry_run(model("FLUX.1-dev"), 2).exit_code, 0);
  struct Damage {
    const char* file;
    bool remove;  // else: truncate into the header
    const char* expected;
  };
  const Damage damages[] = {
      {"text_encoder_2/model-00002-of-00002.safetensors", true, "model-00002-of-00002.safetensors"},
      {"text_encoder/model.safetensors", false, "text_encoder"},
      {"vae/diffusion_pytorch_model.safetensors", true, "vae"},
      {"transformer/diffusion_pytorch_model-00003-of-00003.safetensors", false, "transformer"},
  };
  for (const Damage& d : damages) {
    const std::string dir = scratch("FLUX.1-dev");
    const fs::path file = fs::path(dir) / d.file;
    if (d.remove) fs::remove(file);
    else fs::resize_file(file, 100);
    const std::string msg = error_of([&] { dry_run(dir, 2); });
    EXPECT_NE(msg.find(d.expected), std::string::npos) << d.file << ": " << msg;
    EXPECT_NE(msg, "(no error)") << d.file;
    fs::remove_all(dir);
  }
}

// ---- through the command line, 8 ranks --------------------------------------------------------

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

TEST_F(RealSize, EightRanksGetSevenOrEightBlocksEach) {
  // Open MPI's settings as environment variables (other MPIs ignore them): root, more ranks than
  // cores (Open MPI 4 reads OMPI_MCA_rmaps_base_oversubscribe, Open MPI 5's PRRTE its mapping policy).
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
                          "PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe "
                          "mpirun -np 8 " +
                          shell_quote(std::string(FLUXMPI_BINARY_DIR) + "/fluxmpi") + " --model " +
                          shell_quote(model("FLUX.1-dev")) + " --dry-run 2>&1 < /dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  // Rows "   r  <blocks> ...": count the blocks each rank's description names.
  Preparation prep = dry_run(model("FLUX.1-dev"), 8);
  EXPECT_NE(out.find(prep.dry_run_plan->table()), std::string::npos) << out;
  for (int r = 0; r < 8; ++r) {
    EXPECT_GE(prep.dry_run_plan->blocks(r).count(), 7) << out;
    EXPECT_LE(prep.dry_run_plan->blocks(r).count(), 8) << out;
  }
}

}  // namespace
}  // namespace fluxmpi::app
