// FLUX.2's text encoder split over ranks under mpiexec (2 and 3 ranks): the tiny fixture encoders
// (../shared/fixtures/flux2: tiny-flux2-dev's Mistral tower of 40 layers, the klein pipelines'
// Qwen3 of 36), the prompt (and negative) ids and masks of every pipeline case one row at a time
// and as the whole batch, through plans made by the planner and through hand-made cuts (a slice
// of one layer, a cut right after a requested layer, the final norm on the last slice); rank 0's
// embeddings must be bit-identical to TextDecoder::encode in one process, with one thread on
// every rank. And a rank whose slice fails to load is reported on every rank, not waited for.

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/flux2_configs.h"
#include "io/json_config.h"
#include "io/tensor_store.h"
#include "models/common/tensor_utils.h"
#include "models/llm/text_encoder.h"
#include "mpi_test_main.h"
#include "parallel/message.h"
#include "pipeline/text_split.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

using parallel::TextSlice;
using parallel::TextSplitPlan;
using test::SubtreeCase;

const parallel::MpiEnv& env() { return test::mpi_env(); }

std::vector<SubtreeCase> pipeline_cases() {
  return test::flux2_cases([](const std::string& kind) { return kind == "pipeline"; });
}

std::string encoder_dir(const SubtreeCase& c) { return c.model_dir + "/text_encoder"; }

// A plan cut at `cuts` (the first layer of every slice after the first); memory estimates are
// not the point here.
TextSplitPlan cut_plan(int64_t layers, bool final_norm, const std::vector<int64_t>& cuts) {
  TextSplitPlan plan;
  plan.layers = layers;
  plan.final_norm = final_norm;
  std::vector<int64_t> bounds = {0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(layers);
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    TextSlice s;
    s.rank = static_cast<int>(r);
    s.first_layer = bounds[r];
    s.end_layer = bounds[r + 1];
    s.embeddings = r == 0;
    s.final_norm = final_norm && r + 2 == bounds.size();
    plan.slices.push_back(s);
  }
  return plan;
}

// The planner's split over every rank: the largest equal budget (in steps of one layer's bytes)
// at which the leading ranks no longer hold it with fewer.
TextSplitPlan planned_over_all_ranks(const parallel::LlmEncoderCosts& llm, int P) {
  const uint64_t layer = 4ull * static_cast<uint64_t>(llm.shape.layer_params());
  uint64_t budget = parallel::plan_text_encoder(llm, 1, {}, 4, 512, 0).slices[0].peak_bytes;
  for (;;) {
    std::map<int, uint64_t> budgets;
    for (int r = 0; r < P; ++r) budgets[r] = budget;
    const TextSplitPlan plan = parallel::plan_text_encoder(llm, P, budgets, 4, 512, 0);
    if (plan.ranks() == P) return plan;
    budget -= layer;
  }
}

std::string describe(const TextSplitPlan& plan) {
  std::string s;
  for (const TextSlice& slice : plan.slices)
    s += str_cat(slice.rank == 0 ? "" : ", ", "[", slice.first_layer, ", ", slice.end_layer, ")",
                 slice.final_norm ? "+norm" : "");
  return s;
}

class TextSplit : public testing::TestWithParam<SubtreeCase> {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_P(TextSplit, RankZeroGetsTheSingleProcessEmbeddingsBitForBit) {
  const SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  const int P = env().size();
  const int rank = env().rank();
  const std::vector<int64_t> layers = c.json.at("text_encoder_out_layers").get<std::vector<int64_t>>();
  const std::string dir = encoder_dir(c);
  const llm::DecoderConfig config = llm::read_decoder_config(dir);
  const llm::DecoderPart needed = llm::DecoderPart::for_out_layers(config, layers);
  io::TensorStore store = io::TensorStore::open_dir(dir, "text encoder '" + dir + "'");

  // Rank 0's prompts: every row of the prompt and negative ids alone, then each batch whole.
  std::vector<PromptTokens> prompts;
  std::vector<at::Tensor> reference;
  if (rank == 0) {
    test::CaseTensors tensors(c.file);
    for (const std::string branch : {"prompt", "negative"}) {
      const std::string ids_name = branch == "prompt" ? "prompt_input_ids" : "negative_input_ids";
      if (!tensors.has(ids_name)) continue;
      const at::Tensor ids = tensors.get(ids_name), mask = tensors.get(branch + "_attention_mask");
      for (int64_t b = 0; b < ids.size(0); ++b) prompts.push_back({ids.narrow(0, b, 1), mask.narrow(0, b, 1)});
      if (ids.size(0) > 1) prompts.push_back({ids, mask});
    }
    llm::TextDecoder whole = llm::load_text_decoder(config, store, needed, at::kFloat, test::test_device());
    for (const PromptTokens& p : prompts)
      reference.push_back(whole->encode(p.ids.to(test::test_device()), p.mask.to(test::test_device()), layers));
  }

  parallel::LlmEncoderCosts costs;
  costs.shape = io::parse_llm_shape(io::ConfigReader::from_file(dir + "/config.json", dir + "/config.json"));
  costs.layers = needed.end_layer;
  costs.final_norm = needed.final_norm;
  std::vector<TextSplitPlan> plans = {planned_over_all_ranks(costs, P)};
  const int64_t L = needed.end_layer, k0 = *std::min_element(layers.begin(), layers.end());
  if (P == 2) {
    plans.push_back(cut_plan(L, needed.final_norm, {1}));       // rank 0: embeddings and layer 0
    plans.push_back(cut_plan(L, needed.final_norm, {k0}));      // rank 0 ends with state k0
    plans.push_back(cut_plan(L, needed.final_norm, {L - 1}));   // the last slice: one layer (+ norm)
  } else if (P == 3) {
    plans.push_back(cut_plan(L, needed.final_norm, {1, 2}));
    plans.push_back(cut_plan(L, needed.final_norm, {k0, k0 + 1}));
    plans.push_back(cut_plan(L, needed.final_norm, {L / 3, L - 1}));
  }

  parallel::Messenger messenger(env());
  for (const TextSplitPlan& plan : plans) {
    SCOPED_TRACE("slices " + describe(plan));
    ASSERT_EQ(plan.ranks(), P);
    int code = 0;
    llm::TextDecoder part{nullptr};
    try {
      part = load_text_slice(plan, rank, config, store, layers, at::kFloat, test::test_device());
    } catch (const Error& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
      code = e.exit_code();
    }
    ASSERT_EQ(env().agree(code), 0) << "a rank could not load its slice";
    EXPECT_EQ(part->part().first_layer, plan.slices[static_cast<size_t>(rank)].first_layer);
    EXPECT_EQ(part->embed_tokens.is_empty(), rank != 0);
    EXPECT_EQ(!part->norm.is_empty(), needed.final_norm && rank == P - 1);

    const std::vector<at::Tensor> got =
        encode_prompts_split(plan, env(), &messenger, part, prompts, layers, at::kFloat, test::test_device());
    if (rank != 0) {
      EXPECT_TRUE(got.empty());
      continue;
    }
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i)
      test::expect_identical(str_cat(c.name, " prompt ", i, " ", nn::shape_string(prompts[i].ids.sizes().vec()),
                                     " embeds over ", describe(plan)),
                             got[i], reference[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Flux2, TextSplit, testing::ValuesIn(pipeline_cases()), test::image_case_name);

TEST(TextSplitLoad, ASliceThatFailsToLoadIsReportedOnEveryRank) {
  // The last rank's slice holds layers the checkpoint lacks (a config claiming 2 more layers
  // than tiny-flux2-dev's 40, as with a missing shard): its load throws a WeightError naming
  // the key, and every rank learns it from the agreement instead of waiting in a receive.
  const std::string dir = test::flux2_subtree() + "/tiny-flux2-dev/text_encoder";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no fixture encoder at " << dir;
  const int P = env().size(), rank = env().rank();
  llm::DecoderConfig config = llm::read_decoder_config(dir);
  const int64_t N = config.num_hidden_layers;
  config.num_hidden_layers = N + 2;
  const std::vector<int64_t> layers = {10, N + 1};
  std::vector<int64_t> cuts;
  for (int r = 1; r < P; ++r) cuts.push_back(r * (N - 1) / P);
  cuts.back() = N - 1;
  const TextSplitPlan plan = cut_plan(N + 1, false, cuts);
  io::TensorStore store = io::TensorStore::open_dir(dir, "text encoder '" + dir + "'");

  int code = 0;
  std::string message;
  try {
    load_text_slice(plan, rank, config, store, layers, at::kFloat, at::kCPU);
  } catch (const Error& e) {
    code = e.exit_code();
    message = e.what();
  }
  const int agreed = env().agree(code);
  EXPECT_EQ(agreed, kExitBadInput) << "rank " << rank;
  if (rank == P - 1) {
    std::printf("[ measured ] rank %d: %s\n", rank, message.c_str());
    EXPECT_EQ(code, kExitBadInput);
    EXPECT_NE(message.find("layers." + std::to_string(N)), std::string::npos) << message;
  } else {
    EXPECT_EQ(code, 0) << "rank " << rank << ": " << message;
  }
}

}  // namespace
}  // namespace fluxmpi::pipeline
