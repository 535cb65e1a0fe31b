// The planner with ControlNets: the parameter formula against the built module, rank 0's compute
// (it runs the ControlNets) moving blocks to the other ranks, the residuals each rank holds, and
// the --dry-run lines.

#include <gtest/gtest.h>

#include "io/configs.h"
#include "models/flux/controlnet.h"
#include "parallel/partition.h"
#include "support/controlnet_cases.h"

namespace fluxmpi::parallel {
namespace {

int64_t module_params(const io::ControlNetConfig& c) {
  int64_t n = 0;
  const flux::FluxControlNet net(c);
  for (const auto& p : net->named_parameters(true)) n += p.value().numel();
  return n;
}

io::ControlNetConfig union_pro() {  // the InstantX FLUX.1-dev ControlNet-Union's shape
  io::ControlNetConfig c;
  c.num_layers = 5;
  c.num_single_layers = 10;
  c.guidance_embeds = true;
  c.num_mode = 10;
  return c;
}

TEST(ControlNetPlan, ParameterFormulaMatchesTheModule) {
  io::ControlNetConfig xlabs;
  xlabs.num_layers = 2;
  xlabs.num_single_layers = 0;
  xlabs.conditioning_embedding_channels = 16;
  xlabs.patch_size = 2;
  xlabs.attention_head_dim = 16;
  xlabs.num_attention_heads = 2;
  xlabs.axes_dims_rope = {4, 6, 6};
  xlabs.joint_attention_dim = 32;
  xlabs.pooled_projection_dim = 32;
  for (const io::ControlNetConfig& c : {union_pro(), xlabs, io::ControlNetConfig{}})
    EXPECT_EQ(count_controlnet_params(c), module_params(c));
}

PlanRequest dev_request(int P) {
  PlanRequest r;
  r.transformer.guidance_embeds = true;  // FLUX.1-dev's shape
  r.world_size = P;
  r.dtype_bytes = 2;
  r.image_tokens = 4096;
  r.text_tokens = 512;
  return r;
}

TEST(ControlNetPlan, RankZeroRunsTheControlNetsSoItTakesFewerBlocks) {
  const StagePlan plain = StagePlan::make(dev_request(2));
  PlanRequest r = dev_request(2);
  ControlNetRequest cn;
  cn.nets = {union_pro()};
  cn.runs = {0};
  cn.layout = io::merged_layout({&cn.nets[0]});
  r.controlnet = cn;
  const StagePlan with = StagePlan::make(r);
  // 57 blocks (ties to the rank with less memory: 28 on rank 0); with 15 ControlNet blocks on
  // rank 0, 72 block runs, 36 a rank: rank 0 keeps 21 of its own.
  EXPECT_EQ(plain.blocks(0).count(), 28);
  EXPECT_EQ(with.blocks(0).count(), 21);
  EXPECT_EQ(with.estimate(0).controlnet_weight_bytes, static_cast<uint64_t>(count_controlnet_params(union_pro()) * 2));
  // Rank 1 holds single blocks 2..37: the single samples (interval 4) 0..9.
  const StageBlocks& b1 = with.blocks(1);
  const auto samples = cn.layout.samples_of_blocks(b1.first, b1.last, r.transformer);
  EXPECT_EQ(with.estimate(1).residual_bytes, samples.size() * 4096ull * 3072 * 2);
  EXPECT_GT(with.estimate(0).residual_bytes, 0u);
  EXPECT_EQ(plain.estimate(1).residual_bytes, 0u);
  EXPECT_GT(with.estimate(0).flops_share, plain.estimate(0).flops_share * 0.5);
  const std::string table = with.table();
  EXPECT_NE(table.find("ControlNets: 1 net ("), std::string::npos) << table;
  EXPECT_NE(table.find("residuals and ControlNet buffers (in the peaks): rank 0 "), std::string::npos) << table;
}

}  // namespace
}  // namespace fluxmpi::parallel
