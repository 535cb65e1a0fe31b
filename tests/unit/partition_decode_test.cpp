// The decode plan (parallel/decode_plan.h): which ranks decode VAE tiles, what a helper holds, and
// how the stage planner shows and counts it.

#include <gtest/gtest.h>

#include "core/units.h"
#include "parallel/decode_plan.h"
#include "parallel/partition.h"

#include "support/flux_configs.h"

namespace fluxmpi::parallel {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

io::VaeConfig flux_vae() { return test::flux1_vae_config(); }

VaeDecodeShape shape(int64_t pixels) {
  VaeDecodeShape s;
  s.vae = flux_vae();
  s.latent_height = s.latent_width = pixels / 8;
  s.dtype_bytes = 2;
  return s;
}

PlanRequest small_request(int P, int64_t pixels) {
  PlanRequest r;
  r.transformer.num_layers = 2;
  r.transformer.num_single_layers = 4;
  r.transformer.attention_head_dim = 16;
  r.transformer.num_attention_heads = 2;
  r.transformer.joint_attention_dim = 32;
  r.transformer.pooled_projection_dim = 32;
  r.vae = flux_vae();
  r.world_size = P;
  r.dtype_bytes = 2;
  r.image_tokens = (pixels / 16) * (pixels / 16);
  r.text_tokens = 32;
  r.latent_height = r.latent_width = pixels / 8;
  return r;
}

}  // namespace

TEST(DecodePlan, TilesGoRoundRobinOverAsManyRanksAsThereAreTiles) {
  // 2048 x 2048: 9 tiles of 128 latent cells every 96.
  DecodePlan p = plan_decode(shape(2048), true, 3, 0, {});
  EXPECT_EQ(p.tiles, 9);
  EXPECT_EQ(p.ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.helper_bytes.size(), 2u);
  // 1536 x 1536: 4 tiles, so 4 of 8 ranks.
  p = plan_decode(shape(1536), true, 8, 0, {});
  EXPECT_EQ(p.tiles, 4);
  EXPECT_EQ(p.ranks, (std::vector<int>{0, 1, 2, 3}));
  // Untiled, one tile, or one rank: the leader alone.
  EXPECT_EQ(plan_decode(shape(2048), false, 4, 0, {}).ranks, std::vector<int>{0});
  EXPECT_EQ(plan_decode(shape(1024), true, 4, 0, {}).ranks, std::vector<int>{0});
  EXPECT_EQ(plan_decode(shape(2048), true, 1, 0, {}).ranks, std::vector<int>{0});
  EXPECT_EQ(plan_decode(shape(2048), false, 4, 0, {}).describe({}), "");
}

TEST(DecodePlan, AHelperHoldsOneTilesPassAndItsShareOfTheTiles) {
  const VaeDecodeShape s = shape(2048);
  const uint64_t tile = 1024ull * 1024 * 3 * 2;
  // More helpers, smaller shares: 3 ranks keep 3 tiles each, 9 ranks 1 each.
  EXPECT_EQ(vae_helper_activation_bytes(s, 3) - vae_helper_activation_bytes(s, 1), 2 * tile);
  DecodePlan p = plan_decode(s, true, 3, 100 * kMiB, {});
  EXPECT_EQ(p.helper_bytes.at(1), 100 * kMiB + vae_helper_activation_bytes(s, 3));
  // A helper decodes one tile where the leader also keeps two rows of tiles and the image.
  EXPECT_LT(vae_helper_activation_bytes(s, 3), vae_decode_activation_bytes(s, true));
  // The tiled pass of the leader is smaller than the whole latent's.
  EXPECT_LT(vae_decode_activation_bytes(s, true), vae_decode_activation_bytes(s, false));
}

TEST(DecodePlan, AHelperOverItsBudgetIsLeftOutAndTheNextRankTakesItsPlace) {
  const VaeDecodeShape s = shape(1536);  // 4 tiles
  const uint64_t fixed = 100 * kMiB;
  const uint64_t fits = fixed + vae_helper_activation_bytes(s, 1);
  DecodePlan p = plan_decode(s, true, 6, fixed, {{2, fits - 1}});
  EXPECT_EQ(p.ranks, (std::vector<int>{0, 1, 3, 4}));
  ASSERT_EQ(p.left_out.count(2), 1u);
  EXPECT_NE(p.describe({{2, fits - 1}}).find("rank 2 left out"), std::string::npos) << p.describe({{2, fits - 1}});
  // Two ranks only, and the helper cannot hold its share: the leader alone.
  p = plan_decode(s, true, 2, fixed, {{1, fixed}});
  EXPECT_EQ(p.ranks, std::vector<int>{0});
}

TEST(DecodePlan, TheStagePlanCountsTheDecoderOnEveryHelper) {
  PlanRequest r = small_request(3, 2048);
  r.vae_tiling = true;
  const StagePlan plan = StagePlan::make(r);
  EXPECT_EQ(plan.decode_ranks(), (std::vector<int>{0, 1, 2}));
  for (int rank : {1, 2}) {
    const StageEstimate& e = plan.estimate(rank);
    EXPECT_EQ(e.decode_bytes, plan.decode_plan().helper_bytes.at(rank));
    EXPECT_EQ(e.peak_bytes, std::max(e.denoise_bytes, e.decode_bytes));
    // The tiny transformer's slice is far smaller than the VAE decoder's stage.
    EXPECT_STREQ(e.peak_stage, "decode");
  }
  const std::string table = plan.table();
  EXPECT_NE(table.find("decode: 9 VAE tiles a pass, round robin over ranks 0,1,2"), std::string::npos) << table;
  EXPECT_NE(table.find("spread over 3 ranks"), std::string::npos) << table;
  // Untiled: no helper loads the decoder.
  r.vae_tiling = false;
  const StagePlan untiled = StagePlan::make(r);
  EXPECT_EQ(untiled.decode_ranks(), std::vector<int>{0});
  EXPECT_EQ(untiled.estimate(1).decode_bytes, 0u);
}

}  // namespace fluxmpi::parallel
