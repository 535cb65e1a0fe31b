// FLUX.1 Redux in the stage planner: the SigLIP + embedder stage of rank 0 at FLUX.1-Redux-dev's
// size (parameters against the published model), its place in the plan's text, as rank 0's peak
// when it is the largest stage, and the over-budget message naming it.

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/units.h"
#include "io/redux_dir.h"
#include "parallel/encode_memory.h"
#include "parallel/partition.h"

namespace fluxmpi::parallel {
namespace {

io::ReduxDir shipped() { return io::ReduxDir(std::string(FLUXMPI_SOURCE_DIR) + "/share/fluxmpi/models/FLUX.1-Redux-dev"); }

TEST(PartitionRedux, TheStageCountsFluxReduxDevsWeights) {
  const io::ReduxDir r = shipped();
  // so400m's vision tower without its head (428.2M with it: the 857 MB bf16 file holds that many) and the
  // 64.5M-parameter embedder (the 129 MB bf16 image_embedder file).
  EXPECT_EQ(r.encoder_config().parameters(), 412'987'248);
  EXPECT_EQ(r.embedder_config().parameters(), 64'503'808);
  const EncodeStage bf16 = redux_encode_stage(r.encoder_config(), r.embedder_config(), 1, 2, 256 << 20);
  EXPECT_EQ(bf16.weight_bytes, (412'987'248ull + 64'503'808ull) * 2);
  EXPECT_GT(bf16.activation_bytes, 729ull * 4096 * 2);  // at least the image's embeddings
  EXPECT_LT(bf16.activation_bytes, bf16.weight_bytes / 4);
  const EncodeStage three = redux_encode_stage(r.encoder_config(), r.embedder_config(), 3, 2, 256 << 20);
  EXPECT_EQ(three.activation_bytes - bf16.activation_bytes, 2ull * 729 * 4096 * 2);
}

PlanRequest tiny_request() {
  PlanRequest q;
  q.transformer.num_layers = 2;
  q.transformer.num_single_layers = 4;
  q.transformer.attention_head_dim = 16;
  q.transformer.num_attention_heads = 2;
  q.transformer.joint_attention_dim = 32;
  q.transformer.pooled_projection_dim = 32;
  q.world_size = 2;
  q.image_tokens = 16;
  q.text_tokens = 512 + 729;
  return q;
}

TEST(PartitionRedux, TheStageIsRankZerosAndCanBeItsPeak) {
  PlanRequest q = tiny_request();
  const io::ReduxDir r = shipped();
  q.redux_encode_bytes = redux_encode_stage(r.encoder_config(), r.embedder_config(), 1, 4, 256 << 20).total();
  const StagePlan plan = StagePlan::make(q);
  EXPECT_GT(plan.estimate(0).redux_encode_bytes, q.redux_encode_bytes);
  EXPECT_EQ(plan.estimate(1).redux_encode_bytes, 0u);
  EXPECT_STREQ(plan.estimate(0).peak_stage, "encode redux");
  EXPECT_EQ(plan.estimate(0).peak_bytes, plan.estimate(0).redux_encode_bytes);
  EXPECT_NE(plan.table().find("encode redux "), std::string::npos) << plan.table();
}

TEST(PartitionRedux, AnOverBudgetStageIsNamed) {
  PlanRequest q = tiny_request();
  q.redux_encode_bytes = 3ull << 30;
  q.max_memory = {{0, 1ull << 30}};
  try {
    StagePlan::make(q);
    FAIL() << "planned over the budget";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 encode redux: "), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fluxmpi::parallel
