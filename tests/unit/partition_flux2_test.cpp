// The stage planner for the FLUX.2 family: its parameter-count formulas against the tiny fixture
// weights (every stored tensor counted) and against the real models' published sizes (the shipped
// configs, share/fluxmpi/models/FLUX.2-*), and plans for klein and dev.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "io/flux2_configs.h"
#include "io/model_dir.h"
#include "io/tensor_store.h"
#include "parallel/partition.h"
#include "support/fixtures.h"

namespace fluxmpi::parallel {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kGiB = 1ull << 30;

std::string fixture_pipeline(const std::string& name) { return (fs::path(test::fixture_root()) / "flux2" / name).string(); }
std::string shipped(const std::string& name) {
  return (fs::path(FLUXMPI_SOURCE_DIR) / "share/fluxmpi/models" / name).string();
}

// Elements of every tensor of a store whose key `keep` accepts.
int64_t stored_elements(const io::TensorStore& store, const std::function<bool(const std::string&)>& keep) {
  int64_t n = 0;
  for (const std::string& key : store.keys()) {
    if (!keep(key)) continue;
    int64_t e = 1;
    for (int64_t d : store.get(key).entry->shape) e *= d;
    n += e;
  }
  return n;
}

class Flux2FixtureCounts : public testing::TestWithParam<std::string> {};

TEST_P(Flux2FixtureCounts, TransformerFormulaCountsEveryStoredWeight) {
  FLUXMPI_REQUIRE_FIXTURES();
  const io::ModelDir dir(fixture_pipeline(GetParam()));
  ASSERT_EQ(dir.family(), io::ModelFamily::Flux2);
  const io::TensorStore store = dir.open_weights("transformer");
  const FamilyCosts f = flux2_family_costs(dir.flux2_transformer_config());
  EXPECT_EQ(f.params.total, stored_elements(store, [](const std::string&) { return true; }));
  // One double and one single block, and the embedders (the global modulation included).
  EXPECT_EQ(f.params.double_block, stored_elements(store, [](const std::string& k) { return k.rfind("transformer_blocks.0.", 0) == 0; }));
  EXPECT_EQ(f.params.single_block,
            stored_elements(store, [](const std::string& k) { return k.rfind("single_transformer_blocks.0.", 0) == 0; }));
  EXPECT_EQ(f.params.final_layer, stored_elements(store, [](const std::string& k) {
              return k.rfind("norm_out.", 0) == 0 || k.rfind("proj_out.", 0) == 0;
            }));
}

TEST_P(Flux2FixtureCounts, TextEncoderFormulaCountsItsLanguageModel) {
  FLUXMPI_REQUIRE_FIXTURES();
  const std::string root = fixture_pipeline(GetParam());
  const io::LlmShape s =
      io::parse_llm_shape(io::ConfigReader::from_file(root + "/text_encoder/config.json", "text_encoder/config.json"));
  const io::TensorStore store = io::TensorStore::open_dir(root + "/text_encoder", "text_encoder");
  // The language model's own weights: embeddings, layers, final norm (never the lm_head, the
  // vision tower or the projector).
  auto language_model = [](const std::string& k) {
    return k.find("lm_head") == std::string::npos && k.find("vision_tower") == std::string::npos &&
           k.find("multi_modal_projector") == std::string::npos;
  };
  EXPECT_EQ(s.params(s.num_hidden_layers, true), stored_elements(store, language_model));
  // One layer.
  EXPECT_EQ(s.layer_params(), stored_elements(store, [&](const std::string& k) {
              return language_model(k) && k.find("layers.0.") != std::string::npos;
            }));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2FixtureCounts,
                         testing::Values("tiny-flux2-klein", "tiny-flux2-klein-base", "tiny-flux2-dev"),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& c : n) if (c == '-') c = '_';
                           return n;
                         });

io::Flux2TransformerConfig shipped_transformer(const std::string& model) {
  return io::ModelDir(shipped(model)).flux2_transformer_config();
}

TEST(Flux2RealSize, TransformerSizesAreThePublishedOnes) {
  // FLUX.2 [dev] is "a 32 billion parameter" transformer, klein 4B and 9B (black-forest-labs model cards).
  EXPECT_EQ(flux2_family_costs(shipped_transformer("FLUX.2-dev")).params.total, 32'223'281'152);
  EXPECT_EQ(flux2_family_costs(shipped_transformer("FLUX.2-klein-4B")).params.total, 3'875'544'576);
  EXPECT_EQ(flux2_family_costs(shipped_transformer("FLUX.2-klein-9B")).params.total, 9'078'581'248);
}

TEST(Flux2RealSize, KindsComeFromTheModelIndex) {
  EXPECT_EQ(io::ModelDir(shipped("FLUX.2-dev")).flux2_kind(), io::Flux2Kind::Dev);
  EXPECT_EQ(io::ModelDir(shipped("FLUX.2-klein-4B")).flux2_kind(), io::Flux2Kind::Klein);
  EXPECT_EQ(io::ModelDir(shipped("FLUX.2-klein-base-9B")).flux2_kind(), io::Flux2Kind::KleinBase);
}

TEST(Flux2RealSize, TextEncoderLayersUpToTheLastUsed) {
  // Mistral-Small-3.x 24B's text tower: 30 of 40 layers for the default (10, 20, 30).
  const io::LlmShape m = io::parse_llm_shape(
      io::ConfigReader::from_file(shipped("FLUX.2-dev") + "/text_encoder/config.json", "FLUX.2-dev text_encoder"));
  EXPECT_EQ(m.num_hidden_layers, 40);
  EXPECT_EQ(m.params(40, true), 22'901'314'560);  // + lm_head 0.67 B + vision tower = the published 24 B
  EXPECT_EQ(m.params(30, false), 17'343'754'240);
  const io::LlmShape q = io::parse_llm_shape(
      io::ConfigReader::from_file(shipped("FLUX.2-klein-4B") + "/text_encoder/config.json", "klein text_encoder"));
  EXPECT_TRUE(q.qk_norm);
  EXPECT_EQ(q.params(36, true), 4'022'468'096);  // Qwen3-4B, tied lm_head: "4.0B"
}

PlanRequest flux2_request(const std::string& model, int ranks) {
  const io::ModelDir dir(shipped(model));
  const io::Flux2TransformerConfig& c = dir.flux2_transformer_config();
  PlanRequest r;
  r.transformer = io::transformer_shape(c);
  r.family = flux2_family_costs(c);
  LlmEncoderCosts llm;
  llm.shape = io::parse_llm_shape(dir.read_config("text_encoder/config.json"));
  llm.layers = io::default_text_encoder_layers(dir.flux2_kind()).back();
  r.llm = llm;
  r.world_size = ranks;
  r.dtype_bytes = 2;
  r.dtype_label = "bf16";
  r.image_tokens = 4096;
  r.text_tokens = 512;
  return r;
}

TEST(Flux2Plan, KleinOnTwoRanksSplitsEveryWeightOnce) {
  const StagePlan plan = StagePlan::make(flux2_request("FLUX.2-klein-4B", 2));
  EXPECT_EQ(plan.num_blocks(), 25);
  EXPECT_EQ(plan.estimate(0).weight_bytes + plan.estimate(1).weight_bytes, 2ull * 3'875'544'576);
  // Rank 0 encodes with 27 of Qwen3-4B's 36 layers (no final norm, no lm_head).
  const io::LlmShape q = flux2_request("FLUX.2-klein-4B", 2).llm->shape;
  EXPECT_GT(plan.estimate(0).encode_bytes, 2ull * static_cast<uint64_t>(q.params(27, false)));
  EXPECT_LT(plan.estimate(0).encode_bytes, 2ull * static_cast<uint64_t>(q.params(36, true)) + kGiB);
}

TEST(Flux2Plan, DevBlocksFitFourRanksOf24GiB) {
  // The transformer's 64 GB over four 24 GiB ranks; rank 0's text-encoder stage alone (30 layers,
  // 34.7 GB in bf16) does not fit one of them, so the budget is checked without encoding here.
  PlanRequest r = flux2_request("FLUX.2-dev", 4);
  r.llm.reset();
  r.max_memory = parse_max_memory("24GiB", 4);
  const StagePlan plan = StagePlan::make(r);
  for (int rank = 0; rank < 4; ++rank) EXPECT_LE(plan.estimate(rank).peak_bytes, 24 * kGiB) << "rank " << rank;
  r.llm = flux2_request("FLUX.2-dev", 4).llm;
  EXPECT_THROW(StagePlan::make(r), UsageError);
}

}  // namespace
}  // namespace fluxmpi::parallel
