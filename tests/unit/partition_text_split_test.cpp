// The text-encoder split (parallel/text_split.h): FLUX.2 [dev]'s Mistral text tower at its real
// size (the shipped config, share/fluxmpi/models/FLUX.2-dev) over 4 x 24 GiB ranks in bf16, the
// unbounded and the impossible cases, heterogeneous budgets, and the invariants of every plan
// over a sweep of budgets and world sizes (contiguous slices covering exactly the layers built,
// each within its budget, the fewest ranks).

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "io/flux2_configs.h"
#include "io/json_config.h"
#include "io/model_dir.h"
#include "parallel/partition.h"
#include "parallel/text_split.h"

namespace fluxmpi::parallel {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kMiB = 1ull << 20;
// Rank 0's job buffers in these plans: a few images' text embeddings and latents.
constexpr uint64_t kJobBytes = 64 * kMiB;

std::string shipped(const std::string& name) {
  return (fs::path(FLUXMPI_SOURCE_DIR) / "share/fluxmpi/models" / name).string();
}

// FLUX.2 [dev]'s encoder as the pipeline builds it: 30 of Mistral's 40 layers, no final norm.
LlmEncoderCosts dev_encoder() {
  const io::ModelDir dir(shipped("FLUX.2-dev"));
  LlmEncoderCosts llm;
  llm.shape = io::parse_llm_shape(
      io::ConfigReader::from_file(shipped("FLUX.2-dev") + "/text_encoder/config.json", "FLUX.2-dev text_encoder"));
  llm.layers = io::default_text_encoder_layers(dir.flux2_kind()).back();
  return llm;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return {};
}

// What every plan must be: slices of ranks 0..k-1 in order, contiguous, non-empty, covering
// [0, layers); embeddings on rank 0 only, the final norm on the last slice only (when built);
// weights adding up to the whole encoder's; every slice within its budget.
void expect_valid(const TextSplitPlan& plan, const LlmEncoderCosts& llm, const std::map<int, uint64_t>& budgets) {
  ASSERT_GE(plan.ranks(), 1);
  EXPECT_EQ(plan.layers, llm.layers);
  int64_t next = 0;
  uint64_t weights = 0;
  for (int r = 0; r < plan.ranks(); ++r) {
    const TextSlice& s = plan.slices[static_cast<size_t>(r)];
    EXPECT_EQ(s.rank, r);
    EXPECT_EQ(plan.slice_of(r), &s);
    EXPECT_EQ(s.first_layer, next) << "rank " << r << " does not continue the previous slice";
    EXPECT_GE(s.layers(), 1) << "rank " << r;
    EXPECT_EQ(s.embeddings, r == 0) << "rank " << r;
    EXPECT_EQ(s.final_norm, llm.final_norm && r == plan.ranks() - 1) << "rank " << r;
    EXPECT_EQ(s.job_bytes, r == 0 ? kJobBytes : 0) << "rank " << r;
    EXPECT_EQ(s.peak_bytes, kRuntimeBaselineBytes + s.weight_bytes + s.activation_bytes + s.job_bytes);
    auto b = budgets.find(r);
    if (b != budgets.end()) EXPECT_LE(s.peak_bytes, b->second) << "rank " << r << " over its budget";
    next = s.end_layer;
    weights += s.weight_bytes;
  }
  EXPECT_EQ(next, llm.layers) << "the slices do not cover the layers built";
  EXPECT_EQ(weights, 2ull * static_cast<uint64_t>(llm.shape.params(llm.layers, llm.final_norm)));
  EXPECT_EQ(plan.slice_of(plan.ranks()), nullptr);
}

TEST(TextSplit, DevOnFour24GiBRanksSplitsOverTwo) {
  const LlmEncoderCosts llm = dev_encoder();
  ASSERT_EQ(llm.layers, 30);
  const std::map<int, uint64_t> budgets = parse_max_memory("24GiB", 4);
  const TextSplitPlan plan = plan_text_encoder(llm, 4, budgets, 2, 512, kJobBytes);
  std::printf("[ measured ] %s\n", plan.table().c_str());
  expect_valid(plan, llm, budgets);
  ASSERT_EQ(plan.ranks(), 2);
  EXPECT_TRUE(plan.split());
  EXPECT_EQ(plan.slices[0].layers(), 15);
  EXPECT_EQ(plan.slices[1].layers(), 15);
  // 15 layers of 1.11 GB, plus the 1.34 GB embeddings on rank 0.
  EXPECT_EQ(plan.slices[1].weight_bytes, 2ull * 15 * static_cast<uint64_t>(llm.shape.layer_params()));
  EXPECT_GT(plan.slices[0].peak_bytes, 17 * kGiB);
  EXPECT_EQ(plan.table(),
            "text encoder: layers 0-14 on rank 0 (" + format_bytes(plan.slices[0].peak_bytes) + "), 15-29 on rank 1 (" +
                format_bytes(plan.slices[1].peak_bytes) + "); split over 2 ranks while encoding");
  EXPECT_EQ(plan.rank_of_state(0), 0);
  EXPECT_EQ(plan.rank_of_state(10), 0);
  EXPECT_EQ(plan.rank_of_state(15), 0);  // the output of layer 14
  EXPECT_EQ(plan.rank_of_state(16), 1);
  EXPECT_EQ(plan.rank_of_state(30), 1);
  EXPECT_THROW(plan.rank_of_state(31), InternalError);

  // One 24 GiB rank cannot hold it (34.7 GB of weights).
  const std::string e = error_of([&] { plan_text_encoder(llm, 1, budgets, 2, 512, kJobBytes); });
  std::printf("[ measured ] %s\n", e.c_str());
  EXPECT_NE(e.find("--max-memory"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0 24.0 GiB"), std::string::npos) << e;
  EXPECT_NE(e.find("at most 21 layers"), std::string::npos) << e;
}

TEST(TextSplit, RankZeroAloneMatchesTheStagePlansEncodeStage) {
  // Unbounded (and a budget that holds it): all layers on rank 0, nothing travels, and the
  // estimate is the one StagePlan makes of rank 0's encode stage.
  const LlmEncoderCosts llm = dev_encoder();
  const io::ModelDir dir(shipped("FLUX.2-dev"));
  PlanRequest r;
  r.transformer = io::transformer_shape(dir.flux2_transformer_config());
  r.family = flux2_family_costs(dir.flux2_transformer_config());
  r.llm = llm;
  r.world_size = 4;
  r.dtype_bytes = 2;
  r.text_tokens = 512;
  const StageEstimate stage0 = StagePlan::make(r).estimate(0);
  for (const std::string& budgets : {std::string(), std::string("0=40GiB,24GiB")}) {
    SCOPED_TRACE("--max-memory '" + budgets + "'");
    const std::map<int, uint64_t> b = budgets.empty() ? std::map<int, uint64_t>{} : parse_max_memory(budgets, 4);
    const TextSplitPlan plan = plan_text_encoder(llm, 4, b, 2, 512, stage0.job_bytes);
    ASSERT_EQ(plan.ranks(), 1);
    EXPECT_FALSE(plan.split());
    EXPECT_EQ(plan.slices[0].first_layer, 0);
    EXPECT_EQ(plan.slices[0].end_layer, 30);
    EXPECT_EQ(plan.slices[0].peak_bytes, stage0.encode_bytes);
    EXPECT_EQ(plan.slice_of(1), nullptr);
    EXPECT_EQ(plan.table(), "text encoder: layers 0-29 on rank 0 (" + format_bytes(stage0.encode_bytes) + ")");
  }
}

TEST(TextSplit, ImpossibleBudgetsNameMaxMemory) {
  const LlmEncoderCosts llm = dev_encoder();
  // 4 x 8 GiB hold 6 + 7 + 7 + 7 layers; 1 GiB ranks not even the runtime, embeddings and activations.
  for (const char* budgets : {"8GiB", "1GiB"}) {
    SCOPED_TRACE(budgets);
    const std::string e = error_of([&] { plan_text_encoder(llm, 4, parse_max_memory(budgets, 4), 2, 512, kJobBytes); });
    std::printf("[ measured ] %s\n", e.c_str());
    EXPECT_NE(e.find("--max-memory: the text encoder does not fit ranks 0-3"), std::string::npos) << e;
    EXPECT_NE(e.find(std::string(budgets) == "8GiB" ? "at most 6, 7, 7, 7 layers" : "at most 0, 0, 0, 0 layers"),
              std::string::npos)
        << e;
  }
  // Rank 0 must hold the embeddings and a layer: the unbounded others cannot help.
  const std::string e = error_of([&] { plan_text_encoder(llm, 4, parse_max_memory("0=1GiB", 4), 2, 512, kJobBytes); });
  EXPECT_NE(e.find("rank 0 1.0 GiB, rank 1 unbounded"), std::string::npos) << e;

  EXPECT_NE(e.find("at most 0, 30, 30, 30 layers"), std::string::npos) << e;
}

TEST(TextSplit, UnequalBudgetsGiveRankZeroFewerLayers) {
  const LlmEncoderCosts llm = dev_encoder();
  const std::map<int, uint64_t> budgets = parse_max_memory("0=12GiB,1=40GiB", 2);
  const TextSplitPlan plan = plan_text_encoder(llm, 2, budgets, 2, 512, kJobBytes);
  expect_valid(plan, llm, budgets);
  ASSERT_EQ(plan.ranks(), 2);
  EXPECT_LT(plan.slices[0].layers(), plan.slices[1].layers());
  // Equal budgets: equal counts (8 GiB ranks hold 6 layers on rank 0, 7 elsewhere: 5 x 6), and
  // a remainder on the later ranks (10.5 GiB ranks hold 8 and 9: 7 + 7 + 8 + 8).
  const TextSplitPlan even = plan_text_encoder(llm, 8, parse_max_memory("8GiB", 8), 2, 512, kJobBytes);
  std::printf("[ measured ] %s\n", even.table().c_str());
  ASSERT_EQ(even.ranks(), 5);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(even.slices[static_cast<size_t>(r)].layers(), 6) << "rank " << r;
  const TextSplitPlan rest = plan_text_encoder(llm, 8, parse_max_memory("10752MiB", 8), 2, 512, kJobBytes);
  std::printf("[ measured ] %s\n", rest.table().c_str());
  ASSERT_EQ(rest.ranks(), 4);
  const std::vector<int64_t> counts = {7, 7, 8, 8};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rest.slices[static_cast<size_t>(r)].layers(), counts[static_cast<size_t>(r)]);
}

TEST(TextSplit, FinalNormGoesWithTheLastSlice) {
  LlmEncoderCosts llm = dev_encoder();
  llm.layers = llm.shape.num_hidden_layers;
  llm.final_norm = true;
  // All 40 layers (45 GB): two 20 GiB ranks hold 17 + 18, so three share them.
  const std::map<int, uint64_t> budgets = parse_max_memory("20GiB", 4);
  const TextSplitPlan plan = plan_text_encoder(llm, 4, budgets, 2, 512, kJobBytes);
  std::printf("[ measured ] %s\n", plan.table().c_str());
  expect_valid(plan, llm, budgets);
  EXPECT_EQ(plan.ranks(), 3);
  EXPECT_NE(plan.table().find("+ norm on rank 2"), std::string::npos) << plan.table();
  EXPECT_EQ(plan.rank_of_state(40), 2);
}

TEST(TextSplit, EveryPlanIsValidAndUsesTheFewestRanks) {
  const LlmEncoderCosts llm = dev_encoder();
  int plans = 0;
  for (int world = 1; world <= 8; ++world) {
    for (uint64_t gib = 4; gib <= 40; gib += 2) {
      const std::map<int, uint64_t> budgets = parse_max_memory(std::to_string(gib) + "GiB", world);
      SCOPED_TRACE(std::to_string(world) + " ranks of " + std::to_string(gib) + " GiB");
      TextSplitPlan plan;
      try {
        plan = plan_text_encoder(llm, world, budgets, 2, 512, kJobBytes);
      } catch (const UsageError&) {
        continue;  // these ranks cannot hold it (the impossible cases have their own test)
      }
      ++plans;
      expect_valid(plan, llm, budgets);
      if (plan.ranks() > 1)
        EXPECT_THROW(plan_text_encoder(llm, plan.ranks() - 1, budgets, 2, 512, kJobBytes), UsageError)
            << "fewer ranks would do";
      // A larger world changes nothing: the leading ranks suffice.
      const TextSplitPlan wider = plan_text_encoder(llm, world + 1, budgets, 2, 512, kJobBytes);
      EXPECT_EQ(wider.ranks(), plan.ranks());
    }
  }
  EXPECT_GT(plans, 50);
}

}  // namespace
}  // namespace fluxmpi::parallel
