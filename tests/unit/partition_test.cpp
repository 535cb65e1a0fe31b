// The stage planner: parameter-count formulas (against FLUX.1-dev's published size and against
// the fixture weights), cuts under both balances (against brute force), budgets, the
// --partition and --max-memory parsers and their errors.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "parallel/partition.h"
#include "io/model_dir.h"
#include "models/common/attention.h"
#include "support/fixtures.h"
#include "support/flux_configs.h"

namespace fluxmpi::parallel {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

// The public FLUX.1-dev configs (black-forest-labs/FLUX.1-dev: transformer, text_encoder = CLIP
// ViT-L/14 text model, text_encoder_2 = T5 v1.1 XXL encoder, vae).
io::TransformerConfig flux_dev() {
  io::TransformerConfig c;
  c.num_layers = 19;
  c.num_single_layers = 38;
  c.attention_head_dim = 128;
  c.num_attention_heads = 24;
  c.joint_attention_dim = 4096;
  c.pooled_projection_dim = 768;
  c.guidance_embeds = true;
  c.in_channels = 64;
  c.out_channels = 64;
  return c;
}

io::ClipTextConfig clip_l() {
  io::ClipTextConfig c;
  c.vocab_size = 49408;
  c.hidden_size = 768;
  c.intermediate_size = 3072;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 12;
  c.max_position_embeddings = 77;
  return c;
}

io::T5Config t5_xxl() {
  io::T5Config c;
  c.vocab_size = 32128;
  c.d_model = 4096;
  c.d_kv = 64;
  c.d_ff = 10240;
  c.num_layers = 24;
  c.num_heads = 64;
  c.gated = true;
  c.act = "gelu_new";
  return c;
}

io::VaeConfig flux_vae() { return test::flux1_vae_config(); }

PlanRequest dev_request(int P, Balance balance, int64_t dtype_bytes = 2) {
  PlanRequest r;
  r.transformer = flux_dev();
  r.clip = clip_l();
  r.t5 = t5_xxl();
  r.vae = flux_vae();
  r.world_size = P;
  r.dtype_bytes = dtype_bytes;
  r.dtype_label = dtype_bytes == 2 ? "bf16" : "fp32";
  r.balance = balance;
  r.image_tokens = 4096;  // 1024 x 1024
  r.text_tokens = 512;
  r.attention_chunk_bytes = nn::kAttentionChunkBytes;
  return r;
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

// ---- parameter counts ---------------------------------------------------------------------

TEST(ParamCounts, FluxDevTotalIsThePublishedSize) {
  const TransformerParamCounts p = count_transformer_params(flux_dev());
  // FLUX.1-dev: 11,901,408,320 parameters (sum of the shapes in its safetensors index).
  EXPECT_EQ(p.total, 11901408320LL);
  EXPECT_LT(std::abs(static_cast<double>(p.total) / 11901408320.0 - 1), 0.005);
  EXPECT_EQ(p.double_block, 339831296);
  EXPECT_EQ(p.single_block, 141591808);
  const double ratio = static_cast<double>(p.double_block) / p.single_block;
  EXPECT_NEAR(ratio, 2.4, 0.01) << "a double block holds ~2.4x a single block's parameters";
}

TEST(ParamCounts, SchnellLacksOnlyTheGuidanceEmbedder) {
  io::TransformerConfig schnell = flux_dev();
  schnell.guidance_embeds = false;
  const int64_t guidance_mlp = (256 * 3072 + 3072) + (3072 * 3072 + 3072);
  EXPECT_EQ(count_transformer_params(schnell).total, 11901408320LL - guidance_mlp);
}

TEST(ParamCounts, TextEncodersMatchTheirPublishedSizes) {
  // openai/clip-vit-large-patch14 CLIPTextModel: 123,060,480; google/t5-v1_1-xxl encoder: 4,762,310,656.
  EXPECT_EQ(count_clip_text_params(clip_l()), 123060480);
  EXPECT_EQ(count_t5_encoder_params(t5_xxl()), 4762310656LL);
}

// Every pipeline of the fixture manifest: the formulas equal the element counts in the weight
// headers, component by component (the transformer per block, per embedder group, final layer).
TEST(ParamCounts, EqualTheFixtureWeights) {
  FLUXMPI_REQUIRE_FIXTURES();
  const auto& pipelines = test::manifest()["pipelines"];
  ASSERT_FALSE(pipelines.empty());
  for (auto it = pipelines.begin(); it != pipelines.end(); ++it) {
    SCOPED_TRACE(it.key());
    io::ModelDir dir(test::fixture_root() + "/" + it.value()["path"].get<std::string>());
    auto sum = [](const io::TensorStore& store, const std::function<bool(const std::string&)>& pick) {
      int64_t n = 0;
      for (const std::string& key : store.keys())
        if (pick(key)) n += static_cast<int64_t>(store.get(key).entry->num_elements());
      return n;
    };
    auto under = [](const std::string& prefix) {
      return [prefix](const std::string& key) { return key.rfind(prefix, 0) == 0; };
    };

    const io::TransformerConfig& tc = dir.transformer_config();
    const TransformerParamCounts p = count_transformer_params(tc);
    io::TensorStore transformer = dir.open_weights("transformer");
    for (int64_t i = 0; i < tc.num_layers; ++i)
      EXPECT_EQ(sum(transformer, under(str_cat("transformer_blocks.", i, "."))), p.double_block) << "double block " << i;
    for (int64_t j = 0; j < tc.num_single_layers; ++j)
      EXPECT_EQ(sum(transformer, under(str_cat("single_transformer_blocks.", j, "."))), p.single_block) << "single block " << j;
    EXPECT_EQ(sum(transformer, [&](const std::string& k) {
                return under("x_embedder.")(k) || under("context_embedder.")(k) || under("time_text_embed.")(k);
              }),
              p.embedders);
    EXPECT_EQ(sum(transformer, [&](const std::string& k) { return under("norm_out.")(k) || under("proj_out.")(k); }),
              p.final_layer);
    EXPECT_EQ(sum(transformer, [](const std::string&) { return true; }), p.total);

    io::TensorStore clip = dir.open_weights("text_encoder");
    EXPECT_EQ(sum(clip, [](const std::string& k) { return k.find("position_ids") == std::string::npos; }),
              count_clip_text_params(dir.clip_config()));
    io::TensorStore t5 = dir.open_weights("text_encoder_2");
    EXPECT_EQ(sum(t5, [](const std::string&) { return true; }), count_t5_encoder_params(dir.t5_config()));
    io::TensorStore vae = dir.open_weights("vae");
    EXPECT_EQ(sum(vae, [&](const std::string& k) { return under("decoder.")(k) || under("post_quant_conv.")(k); }),
              count_vae_decoder_params(dir.vae_config()));
  }
}

// ---- plans ---------------------------------------------------------------------------------

// A plan's cost as the planner compares plans: per level, the per-rank values sorted from the
// largest down (compute: blocks, peak memory, FLOPs; memory: peak memory, blocks), compared
// lexicographically.
using Objective = std::vector<std::vector<int64_t>>;

Objective objective_of(const StagePlan& plan, Balance balance) {
  std::vector<int64_t> blocks, peaks, flops;
  for (int r = 0; r < plan.world_size(); ++r) {
    blocks.push_back(plan.blocks(r).count());
    peaks.push_back(static_cast<int64_t>(plan.estimate(r).peak_bytes));
    flops.push_back(std::llround(plan.estimate(r).step_flops));
  }
  for (auto* v : {&blocks, &peaks, &flops}) std::sort(v->begin(), v->end(), std::greater<int64_t>());
  return balance == Balance::Compute ? Objective{blocks, peaks, flops} : Objective{peaks, blocks};
}

// The best objective over every contiguous split (each one planned as a --partition override;
// splits that break a budget are skipped). Infinite when none fits.
Objective brute_force_best(PlanRequest request) {
  const int P = request.world_size;
  const int64_t B = request.transformer.num_blocks();
  std::optional<Objective> best;
  std::vector<BlockRange> ranges(P);
  std::function<void(int, int64_t)> walk = [&](int rank, int64_t first) {
    if (rank == P - 1) {
      ranges[rank] = {first, B - 1};
      request.partition = ranges;
      try {
        Objective o = objective_of(StagePlan::make(request), request.balance);
        if (!best || o < *best) best = o;
      } catch (const UsageError&) {
        // over a budget: not a candidate
      }
      return;
    }
    for (int64_t last = first; last <= B - (P - rank); ++last) {
      ranges[rank] = {first, last};
      walk(rank + 1, last + 1);
    }
  };
  walk(0, 0);
  return best.value_or(Objective{});
}

void expect_well_formed(const StagePlan& plan, const PlanRequest& request) {
  const TransformerParamCounts p = count_transformer_params(request.transformer);
  int64_t next = 0;
  uint64_t weight_sum = 0;
  double share_sum = 0;
  for (int r = 0; r < plan.world_size(); ++r) {
    const StageBlocks& b = plan.blocks(r);
    EXPECT_EQ(b.first, next) << "rank " << r;
    EXPECT_GE(b.count(), 1) << "rank " << r;
    EXPECT_EQ(b.last - b.first + 1, b.count()) << "rank " << r;
    next = b.last + 1;
    weight_sum += plan.estimate(r).weight_bytes;
    share_sum += plan.estimate(r).flops_share;
    EXPECT_EQ(plan.owns_embedders(r), r == 0);
    EXPECT_EQ(plan.owns_final_layer(r), r == plan.world_size() - 1);
  }
  EXPECT_EQ(next, request.transformer.num_blocks());
  EXPECT_EQ(weight_sum, static_cast<uint64_t>(p.total * request.dtype_bytes)) << "weights must sum to the transformer's";
  EXPECT_NEAR(share_sum, 1.0, 1e-9);
}

class FluxDevPlans : public testing::TestWithParam<std::tuple<int, Balance>> {};

TEST_P(FluxDevPlans, AreWellFormedAndOptimal) {
  const auto [P, balance] = GetParam();
  PlanRequest request = dev_request(P, balance);
  const StagePlan plan = StagePlan::make(request);
  ASSERT_EQ(plan.world_size(), P);
  expect_well_formed(plan, request);
  EXPECT_EQ(objective_of(plan, balance), brute_force_best(request)) << plan.table();
  if (balance == Balance::Compute) {
    int64_t max_blocks = 0;
    for (int r = 0; r < P; ++r) max_blocks = std::max(max_blocks, plan.blocks(r).count());
    EXPECT_EQ(max_blocks, (57 + P - 1) / P) << plan.table();
  }
}

INSTANTIATE_TEST_SUITE_P(P1to4, FluxDevPlans,
                         testing::Combine(testing::Values(1, 2, 3, 4), testing::Values(Balance::Compute, Balance::Memory)),
                         [](const testing::TestParamInfo<std::tuple<int, Balance>>& info) {
                           return str_cat("P", std::get<0>(info.param), "_", balance_name(std::get<1>(info.param)));
                         });

TEST(FluxDevPlans, ComputeCuts) {
  // Ties in the largest slice go to the split with the smaller peak memory: rank 0, which holds
  // the double blocks and the embedders, takes the fewer blocks.
  const StagePlan p1 = StagePlan::make(dev_request(1, Balance::Compute));
  EXPECT_EQ(p1.blocks(0).describe(), "double 0-18, single 0-37");
  const StagePlan p2 = StagePlan::make(dev_request(2, Balance::Compute));
  EXPECT_EQ(p2.blocks(0).describe(), "double 0-18, single 0-8");
  EXPECT_EQ(p2.blocks(1).describe(), "single 9-37");
  const StagePlan p3 = StagePlan::make(dev_request(3, Balance::Compute));
  EXPECT_EQ(p3.blocks(0).describe(), "double 0-18");
  EXPECT_EQ(p3.blocks(1).describe(), "single 0-18");
  EXPECT_EQ(p3.blocks(2).describe(), "single 19-37");
  EXPECT_EQ(p3.blocks(1).first, 19);
  EXPECT_EQ(p3.blocks(1).first_single, 0);
  EXPECT_TRUE(p3.blocks(0).ends_in_double());
  EXPECT_FALSE(p3.blocks(1).starts_in_double());
}

TEST(FluxDevPlans, MemoryBalanceEvensOutWeights) {
  const StagePlan compute = StagePlan::make(dev_request(2, Balance::Compute));
  const StagePlan memory = StagePlan::make(dev_request(2, Balance::Memory));
  auto spread = [](const StagePlan& p) {
    return std::abs(static_cast<double>(p.estimate(0).peak_bytes) - static_cast<double>(p.estimate(1).peak_bytes));
  };
  EXPECT_LT(spread(memory), spread(compute));
  // The memory cut falls inside the double blocks (19 double blocks are 57% of the weights).
  EXPECT_TRUE(memory.blocks(1).starts_in_double()) << memory.table();
  // Each rank's peak is within one double block of the other's.
  EXPECT_LT(spread(memory), 339831296.0 * 2) << memory.table();
}

TEST(FluxDevPlans, FlopsShareFollowsBlockCounts) {
  const StagePlan p3 = StagePlan::make(dev_request(3, Balance::Compute));
  // Equal block counts: equal shares but for the embedders (rank 0) and the final layer (rank 2),
  // which are under 0.1% of a step.
  for (int r = 0; r < 3; ++r) EXPECT_NEAR(p3.estimate(r).flops_share, 1.0 / 3, 1e-3) << "rank " << r;
}

TEST(FluxDevPlans, RankZeroStages) {
  PlanRequest request = dev_request(2, Balance::Compute);
  const StagePlan plan = StagePlan::make(request);
  const StageEstimate& e = plan.estimate(0);
  const uint64_t encoders = static_cast<uint64_t>((123060480LL + 4762310656LL) * 2);
  EXPECT_GT(e.encode_bytes, kRuntimeBaselineBytes + encoders);
  EXPECT_GT(e.decode_bytes, e.denoise_bytes - e.activation_bytes);
  EXPECT_EQ(e.peak_bytes, std::max({e.encode_bytes, e.denoise_bytes, e.decode_bytes}));
  EXPECT_EQ(plan.estimate(1).encode_bytes, 0u);
  EXPECT_EQ(plan.estimate(1).decode_bytes, 0u);

  // --keep-encoders: the encoders stay resident through the later stages.
  request.keep_encoders = true;
  request.partition = {{0, 27}, {28, 56}};
  const StagePlan kept = StagePlan::make(request);
  EXPECT_EQ(kept.estimate(0).denoise_bytes, e.denoise_bytes + encoders);
  EXPECT_EQ(kept.estimate(0).decode_bytes, e.decode_bytes + encoders);
  EXPECT_EQ(kept.estimate(1).denoise_bytes, plan.estimate(1).denoise_bytes);

  // Without text encoders (a resumed run) or VAE there is no encode / decode stage.
  request.clip.reset();
  request.t5.reset();
  request.vae.reset();
  const StagePlan bare = StagePlan::make(request);
  EXPECT_EQ(bare.estimate(0).encode_bytes, 0u);
  EXPECT_EQ(bare.estimate(0).decode_bytes, 0u);
  EXPECT_EQ(bare.estimate(0).peak_bytes, bare.estimate(0).denoise_bytes);
}

TEST(FluxDevPlans, ActivationsGrowWithMicrobatchAndTokens) {
  PlanRequest request = dev_request(2, Balance::Compute);
  const uint64_t base = StagePlan::make(request).estimate(1).activation_bytes;
  request.microbatch = 2;
  EXPECT_GT(StagePlan::make(request).estimate(1).activation_bytes, base);
  request.microbatch = 1;
  request.image_tokens = 1024;  // 512 x 512
  EXPECT_LT(StagePlan::make(request).estimate(1).activation_bytes, base);
}

TEST(FluxDevPlans, UnchunkedAttentionIsTheUpperBound) {
  // Without the chunk limit the estimate holds every head's scores: 2 x 24 x 4608^2 x 2 bytes.
  PlanRequest request = dev_request(2, Balance::Compute);
  const uint64_t chunked = StagePlan::make(request).estimate(1).activation_bytes;
  request.attention_chunk_bytes = 0;
  const uint64_t full = StagePlan::make(request).estimate(1).activation_bytes;
  const uint64_t per_head = 4608ull * 4608 * 2;
  const uint64_t chunk = (nn::kAttentionChunkBytes / per_head) * per_head;
  EXPECT_EQ(full - chunked, kScoreTensors * (24 * per_head - chunk));
}

TEST(FluxDevPlans, TableShowsEveryRank) {
  const std::string table = StagePlan::make(dev_request(2, Balance::Compute)).table();
  EXPECT_NE(table.find("19 double + 38 single blocks, 11,901,408,320 parameters"), std::string::npos) << table;
  EXPECT_NE(table.find("double 0-18, single 0-8"), std::string::npos) << table;
  EXPECT_NE(table.find("single 9-37"), std::string::npos) << table;
  EXPECT_NE(table.find("balance compute over 2 ranks"), std::string::npos) << table;
  EXPECT_NE(table.find("rank 0 stages: encode"), std::string::npos) << table;
}

TEST(FluxDevPlans, PatchKeyValueBuffersCountPerBlockInThePeaks) {
  PlanRequest request = dev_request(2, Balance::Compute);
  const StagePlan plain = StagePlan::make(request);
  // --patches: one image, one pass, bf16: 2 x (4096 + 512) tokens x 3072 x 2 bytes per block.
  const uint64_t per_block = 2ull * (4096 + 512) * 3072 * 2;
  request.kv_cache_block_bytes = per_block;
  request.partition = {BlockRange{plain.blocks(0).first, plain.blocks(0).last},
                       BlockRange{plain.blocks(1).first, plain.blocks(1).last}};
  const StagePlan same_cut = StagePlan::make(request);
  for (int r = 0; r < 2; ++r) {
    const uint64_t kv = static_cast<uint64_t>(plain.blocks(r).count()) * per_block;
    EXPECT_EQ(same_cut.estimate(r).kv_cache_bytes, kv) << "rank " << r;
    EXPECT_EQ(same_cut.estimate(r).denoise_bytes, plain.estimate(r).denoise_bytes + kv) << "rank " << r;
  }
  EXPECT_NE(same_cut.table().find("patch pipelining: key/value buffers 54.0 MiB per block (in the peaks): rank 0 "),
            std::string::npos)
      << same_cut.table();
  EXPECT_EQ(plain.table().find("key/value buffers"), std::string::npos);
  // A budget the plain plan just meets: with the buffers rank 1 must give blocks back.
  request.partition.clear();
  request.max_memory = {{1, plain.estimate(1).peak_bytes}};
  const StagePlan bounded = StagePlan::make(request);
  EXPECT_LE(bounded.estimate(1).peak_bytes, plain.estimate(1).peak_bytes);
  EXPECT_LT(bounded.blocks(1).count(), plain.blocks(1).count()) << bounded.table();
}

// ---- budgets -------------------------------------------------------------------------------

TEST(Budgets, AreRespectedAndStillOptimal) {
  for (Balance balance : {Balance::Compute, Balance::Memory}) {
    PlanRequest request = dev_request(2, balance);
    request.max_memory = {{0, 12 * kGiB}};
    const StagePlan plan = StagePlan::make(request);
    SCOPED_TRACE(plan.table());
    EXPECT_LE(plan.estimate(0).peak_bytes, 12 * kGiB);
    // The unbounded plan breaks the budget: the bound moved the cut.
    EXPECT_GT(StagePlan::make(dev_request(2, balance)).estimate(0).peak_bytes, 12 * kGiB);
    expect_well_formed(plan, request);
    EXPECT_EQ(objective_of(plan, balance), brute_force_best(request));
  }
  PlanRequest request = dev_request(3, Balance::Compute);
  request.max_memory = parse_max_memory("0=16GiB,1=24GiB", 3);
  const StagePlan plan = StagePlan::make(request);
  EXPECT_LE(plan.estimate(0).peak_bytes, 16 * kGiB);
  EXPECT_LE(plan.estimate(1).peak_bytes, 24 * kGiB);
  EXPECT_NE(plan.table().find("16.0 GiB"), std::string::npos) << plan.table();
}

TEST(Budgets, TooSmallForTheModelIsAClearError) {
  PlanRequest request = dev_request(2, Balance::Compute);
  request.max_memory = {{0, 10 * kGiB}, {1, 10 * kGiB}};
  EXPECT_NE(usage_error([&] { StagePlan::make(request); })
                .find("--max-memory: no split of the 57 transformer blocks over 2 ranks fits the budgets (0=10.0 GiB, "
                      "1=10.0 GiB): the transformer's weights are 22.2 GiB in bf16"),
            std::string::npos)
      << usage_error([&] { StagePlan::make(request); });
}

TEST(Budgets, RankZeroMustHoldTheTextEncoders) {
  PlanRequest request = dev_request(2, Balance::Memory);
  request.max_memory = {{0, 8 * kGiB}};  // T5-XXL alone is 8.9 GiB in bf16
  const std::string msg = usage_error([&] { StagePlan::make(request); });
  EXPECT_NE(msg.find("--max-memory: rank 0 encode: 9.5 GiB (text encoders 9.1 GiB in bf16) > 8.0 GiB even with a single "
                     "block; raise the budget"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("--dtype"), std::string::npos) << msg;  // bf16 already
}

TEST(Budgets, ARankBelowItsFixedLoadIsNamed) {
  PlanRequest request = dev_request(2, Balance::Compute);
  request.max_memory = {{1, 1 * kGiB}};
  const std::string msg = usage_error([&] { StagePlan::make(request); });
  EXPECT_NE(msg.find("--max-memory: rank 1 denoise: "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" > 1.0 GiB even with a single block"), std::string::npos) << msg;
}

TEST(Budgets, DecodeStageSuggestsTiling) {
  // 4096 x 4096 in bf16 on 2 ranks with tiling left to the user: rank 0's decode stage (32 GiB
  // of VAE activations, above the 23.7 GiB of its denoise stage) is the one that cannot fit, and
  // tiling is the advice.
  PlanRequest request = dev_request(2, Balance::Compute);
  request.image_tokens = 65536;
  request.latent_height = request.latent_width = 512;
  request.auto_vae_tiling = false;
  request.max_memory = {{0, 28 * kGiB}};
  const std::string msg = usage_error([&] { StagePlan::make(request); });
  EXPECT_NE(msg.find("--max-memory: rank 0 decode: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("(VAE activations 32.5 GiB) > 28.0 GiB even with a single block; use --vae-tiling, raise the "
                     "budget or make smaller images"),
            std::string::npos)
      << msg;
  // Switched on by the planner, the same budget fits.
  request.auto_vae_tiling = true;
  const StagePlan plan = StagePlan::make(request);
  EXPECT_TRUE(plan.vae_tiling());
  EXPECT_TRUE(plan.vae_tiling_auto());
  EXPECT_LE(plan.estimate(0).peak_bytes, 28 * kGiB);
}

TEST(Budgets, OneRankIsSingular) {
  PlanRequest request = dev_request(1, Balance::Compute);
  EXPECT_NE(StagePlan::make(request).table().find("balance compute on 1 rank;"), std::string::npos);
  request.max_memory = {{0, 10 * kGiB}};
  const std::string msg = usage_error([&] { StagePlan::make(request); });
  EXPECT_EQ(msg.find("1 ranks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--max-memory: rank 0 denoise: "), std::string::npos) << msg;
}

TEST(Budgets, OverrideAboveABudgetIsAnError) {
  PlanRequest request = dev_request(2, Balance::Compute);
  request.partition = parse_partition("0:0-8,1:9-56", 2, 57);
  request.max_memory = {{1, 16 * kGiB}};
  const std::string msg = usage_error([&] { StagePlan::make(request); });
  EXPECT_NE(msg.find("--partition gives rank 1 blocks 9-56 (double 9-18, single 0-37), estimated peak"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("above its --max-memory budget of 16.0 GiB"), std::string::npos) << msg;
}

TEST(Budgets, Parsing) {
  auto b = parse_max_memory("0=16GiB, 1=24GiB", 2);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], 16 * kGiB);
  EXPECT_EQ(b[1], 24 * kGiB);
  EXPECT_TRUE(parse_max_memory("", 4).empty());
  EXPECT_EQ(parse_max_memory("3=512MiB", 4).at(3), 512ull << 20);
  EXPECT_NE(usage_error([] { parse_max_memory("2=16GiB", 2); }).find("rank 2 is out of range: the job has 2 ranks (0-1)"),
            std::string::npos);
  EXPECT_NE(usage_error([] { parse_max_memory("0=1GiB,0=2GiB", 2); }).find("rank 0 is given twice"), std::string::npos);
  // A value without a rank is every rank's budget; named ranks keep theirs.
  EXPECT_EQ(parse_max_memory("16GiB", 3), (std::map<int, uint64_t>{{0, 16 * kGiB}, {1, 16 * kGiB}, {2, 16 * kGiB}}));
  EXPECT_EQ(parse_max_memory("1=8G, 16G", 2), (std::map<int, uint64_t>{{0, 16 * kGiB}, {1, 8 * kGiB}}));
  EXPECT_EQ(parse_max_memory("500M", 1).at(0), 500ull << 20);
  EXPECT_EQ(parse_max_memory("16gib", 1).at(0), 16 * kGiB);
  EXPECT_NE(usage_error([] { parse_max_memory("16GiB,8GiB", 2); }).find("more than one budget without a rank"),
            std::string::npos);
  EXPECT_NE(usage_error([] { parse_max_memory("0:16GiB", 2); }).find("--max-memory: unknown unit"), std::string::npos);
  EXPECT_NE(usage_error([] { parse_max_memory("x=16GiB", 2); }).find("'x' is not a rank number"), std::string::npos);
  EXPECT_NE(usage_error([] { parse_max_memory("0=16 apples", 2); }).find("--max-memory for rank 0"), std::string::npos);
}

// ---- --partition ---------------------------------------------------------------------------

TEST(PartitionOverride, ParsesAndPlans) {
  auto ranges = parse_partition("0:0-8,1:9-56", 2, 57);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].first, 0);
  EXPECT_EQ(ranges[0].last, 8);
  EXPECT_EQ(ranges[1].first, 9);
  EXPECT_EQ(ranges[1].last, 56);
  // Any entry order; "r:a" is one block.
  auto single = parse_partition("1:1-56, 0:0", 2, 57);
  EXPECT_EQ(single[0].count(), 1);
  EXPECT_EQ(single[1].first, 1);

  PlanRequest request = dev_request(2, Balance::Memory);
  request.partition = ranges;
  const StagePlan plan = StagePlan::make(request);
  EXPECT_TRUE(plan.overridden());
  EXPECT_EQ(plan.blocks(0).describe(), "double 0-8");
  EXPECT_EQ(plan.blocks(1).describe(), "double 9-18, single 0-37");
  EXPECT_EQ(plan.blocks(1).first_double, 9);
  EXPECT_EQ(plan.blocks(1).num_double, 10);
  EXPECT_EQ(plan.blocks(1).num_single, 38);
  expect_well_formed(plan, request);
  EXPECT_NE(plan.table().find("--partition override over 2 ranks"), std::string::npos);
}

TEST(PartitionOverride, Errors) {
  auto err = [](const std::string& text, int P) { return usage_error([&] { parse_partition(text, P, 57); }); };
  EXPECT_NE(err("0:0-8,1:10-56", 2).find("blocks 9 are given to no rank"), std::string::npos) << err("0:0-8,1:10-56", 2);
  EXPECT_NE(err("0:0-10,1:9-56", 2).find("blocks 9-10 are given to both rank 0 and rank 1"), std::string::npos)
      << err("0:0-10,1:9-56", 2);
  EXPECT_NE(err("0:0-8,1:9-50", 2).find("blocks 51-56 are given to no rank"), std::string::npos);
  EXPECT_NE(err("0:1-8,1:9-56", 2).find("blocks 0 are given to no rank"), std::string::npos);
  EXPECT_NE(err("0:0-8,2:9-56", 2).find("rank 2 is out of range: the job has 2 ranks (0-1)"), std::string::npos);
  EXPECT_NE(err("0:0-56", 2).find("rank 1 has no blocks"), std::string::npos);
  EXPECT_NE(err("0:0-8,0:9-56", 2).find("rank 0 is given twice"), std::string::npos);
  EXPECT_NE(err("0:0-8,1:9-57", 2).find("block 57 of rank 1 is out of range: the transformer has 57 blocks (0-56)"),
            std::string::npos);
  EXPECT_NE(err("0:9-56,1:0-8", 2).find("slices must follow rank order, but rank 1 has blocks 0-8 before rank 0's 9-56"),
            std::string::npos)
      << err("0:9-56,1:0-8", 2);
  EXPECT_NE(err("0:8-0,1:9-56", 2).find("rank 0 has the empty range 8-0"), std::string::npos);
  EXPECT_NE(err("0-8,1:9-56", 2).find("expected entries like 0:0-8,1:9-56"), std::string::npos);
  EXPECT_NE(err("0:a-8,1:9-56", 2).find("expected entries like"), std::string::npos);
  EXPECT_NE(err("0:0-8,1:9-56,", 2).find("expected entries like"), std::string::npos);
}

TEST(PartitionOverride, MoreRanksThanBlocksIsAnError) {
  const std::string msg = usage_error([] { StagePlan::make(dev_request(58, Balance::Compute)); });
  EXPECT_NE(msg.find("cannot split the transformer's 57 blocks over 58 ranks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at most 57 ranks"), std::string::npos) << msg;
  // 57 ranks: one block each.
  const StagePlan plan = StagePlan::make(dev_request(57, Balance::Compute));
  for (int r = 0; r < 57; ++r) EXPECT_EQ(plan.blocks(r).count(), 1);
}

TEST(Balance, Parsing) {
  EXPECT_EQ(parse_balance("compute"), Balance::Compute);
  EXPECT_EQ(parse_balance("memory"), Balance::Memory);
  EXPECT_NE(usage_error([] { parse_balance("speed"); }).find("--balance must be 'compute' or 'memory', got 'speed'"),
            std::string::npos);
}

// ---- key ownership -------------------------------------------------------------------------

TEST(KeyOwnership, FollowsTheSlices) {
  const StagePlan plan = StagePlan::make(dev_request(2, Balance::Compute));  // double 0-18, single 0-8 | single 9-37
  auto owner = [&](const std::string& key) {
    int found = -1, owners = 0;
    for (int r = 0; r < 2; ++r)
      if (plan.owns_key(r, key)) { found = r; ++owners; }
    EXPECT_EQ(owners, 1) << key;
    return found;
  };
  EXPECT_EQ(owner("transformer_blocks.18.attn.to_q.weight"), 0);
  EXPECT_EQ(owner("single_transformer_blocks.8.proj_out.weight"), 0);
  EXPECT_EQ(owner("single_transformer_blocks.9.proj_out.weight"), 1);
  EXPECT_EQ(owner("single_transformer_blocks.37.norm.linear.bias"), 1);
  EXPECT_EQ(owner("x_embedder.weight"), 0);
  EXPECT_EQ(owner("time_text_embed.guidance_embedder.linear_1.weight"), 0);
  EXPECT_EQ(owner("norm_out.linear.weight"), 1);
  EXPECT_EQ(owner("proj_out.bias"), 1);
  // Unknown modules and out-of-config blocks go to rank 0, which reports them as unclaimed.
  EXPECT_EQ(owner("single_transformer_blocks.38.proj_out.weight"), 0);
  EXPECT_EQ(owner("pos_embed.something"), 0);
  EXPECT_EQ(plan.rank_of_block(27), 0);
  EXPECT_EQ(plan.rank_of_block(28), 1);
}

// Every key of every fixture transformer has exactly one owner for every world size.
TEST(KeyOwnership, EveryFixtureKeyHasOneOwner) {
  FLUXMPI_REQUIRE_FIXTURES();
  const auto& pipelines = test::manifest()["pipelines"];
  for (auto it = pipelines.begin(); it != pipelines.end(); ++it) {
    io::ModelDir dir(test::fixture_root() + "/" + it.value()["path"].get<std::string>());
    io::TensorStore store = dir.open_weights("transformer");
    const io::TransformerConfig& tc = dir.transformer_config();
    for (int P = 1; P <= tc.num_blocks(); ++P) {
      for (Balance balance : {Balance::Compute, Balance::Memory}) {
        PlanRequest request;
        request.transformer = tc;
        request.world_size = P;
        request.balance = balance;
        request.image_tokens = 16;
        request.text_tokens = 8;
        request.attention_chunk_bytes = nn::kAttentionChunkBytes;
        const StagePlan plan = StagePlan::make(request);
        for (const std::string& key : store.keys()) {
          int owners = 0;
          for (int r = 0; r < P; ++r) owners += plan.owns_key(r, key) ? 1 : 0;
          EXPECT_EQ(owners, 1) << it.key() << ": " << key << " with P = " << P;
        }
      }
    }
  }
}

// Image inputs: rank 0's VAE encode stage is a stage of its own, counted in its peak and its
// budget, between the text encoders and the blocks (parallel/encode_memory.h sizes it).
TEST(ImageEncodeStage, CountsInRankZerosPeakAndBudget) {
  PlanRequest r = dev_request(2, Balance::Compute);
  const StagePlan without = StagePlan::make(r);
  EXPECT_EQ(without.estimate(0).image_encode_bytes, 0u);
  r.image_encode_bytes = uint64_t{40} << 30;  // far above every other stage
  const StagePlan with = StagePlan::make(r);
  EXPECT_EQ(std::string(with.estimate(0).peak_stage), "encode images");
  EXPECT_GT(with.estimate(0).peak_bytes, r.image_encode_bytes);
  EXPECT_EQ(with.estimate(1).image_encode_bytes, 0u);  // only rank 0 encodes
  r.max_memory = parse_max_memory("0=30GiB", 2);
  EXPECT_NE(usage_error([&] { StagePlan::make(r); }).find("rank 0 encode images:"), std::string::npos)
      << usage_error([&] { StagePlan::make(r); });
}

}  // namespace
}  // namespace fluxmpi::parallel
