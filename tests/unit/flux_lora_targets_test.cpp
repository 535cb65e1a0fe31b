// LoRA targets of the FLUX transformer: the table of linear layers (derived from the config, so
// that rank 0 checks LoRAs before any weight exists) equals the modules' own 2-D weights, with and
// without the guidance embedder; kohya names of original modules resolve to the diffusers modules
// with the rows diffusers' converter gives them (fused q|k|v, q|k|v|mlp, the swapped final adaLN).

#include <gtest/gtest.h>

#include "core/error.h"
#include "models/flux/lora_targets.h"
#include "models/flux/transformer.h"

namespace fluxmpi::flux {
namespace {

io::TransformerConfig tiny_config(bool guidance) {
  io::TransformerConfig c;
  c.in_channels = 16;
  c.out_channels = 16;
  c.num_layers = 2;
  c.num_single_layers = 3;
  c.attention_head_dim = 8;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 24;
  c.pooled_projection_dim = 12;
  c.guidance_embeds = guidance;
  c.axes_dims_rope = {2, 2, 4};
  return c;
}

TEST(FluxLoraTargets, TableEqualsTheModulesLinearWeights) {
  for (bool guidance : {true, false}) {
    const io::TransformerConfig c = tiny_config(guidance);
    FluxTransformer model(c, TransformerPart::whole(c));
    nn::WeightShapes from_model;
    const std::string suffix = ".weight";
    for (const auto& p : model->named_parameters(true)) {
      const std::string& key = p.key();
      if (p.value().dim() != 2 || key.size() < suffix.size() || key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      from_model[key.substr(0, key.size() - suffix.size())] = p.value().sizes().vec();
    }
    EXPECT_EQ(flux_linear_shapes(c), from_model) << "guidance_embeds " << guidance;
  }
}

TEST(FluxLoraTargets, KohyaNamesResolveToDiffusersRows) {
  const io::TransformerConfig c = tiny_config(true);
  const int64_t D = c.inner_dim();
  const nn::KohyaResolver resolve = flux_kohya_resolver(c);
  auto rows = resolve("double_blocks_1_img_attn_qkv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].module, "transformer_blocks.1.attn.to_q");
  EXPECT_EQ(rows[1].module, "transformer_blocks.1.attn.to_k");
  EXPECT_EQ(rows[2].module, "transformer_blocks.1.attn.to_v");
  EXPECT_EQ(rows[1].row_begin, D);
  EXPECT_EQ(rows[2].row_end, 3 * D);
  rows = resolve("double_blocks_0_txt_attn_qkv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2].module, "transformer_blocks.0.attn.add_v_proj");
  rows = resolve("single_blocks_2_linear1");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[3].module, "single_transformer_blocks.2.proj_mlp");
  EXPECT_EQ(rows[3].row_begin, 3 * D);
  EXPECT_EQ(rows[3].row_end, 7 * D);
  rows = resolve("single_blocks_2_modulation_lin");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].module, "single_transformer_blocks.2.norm.linear");
  rows = resolve("final_layer_adaLN_modulation_1");  // (shift, scale) -> norm_out's (scale, shift)
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].module, "norm_out.linear");
  EXPECT_EQ(rows[0].row_begin, 0);
  EXPECT_EQ(rows[0].target_row_begin, D);
  EXPECT_EQ(rows[1].target_row_begin, 0);
  EXPECT_TRUE(resolve("double_blocks_2_img_attn_qkv").empty()) << "block beyond num_layers";
  EXPECT_TRUE(resolve("double_blocks_0_img_attn_qkvx").empty());
  // Every resolved row range fits the table.
  const nn::WeightShapes shapes = flux_linear_shapes(c);
  for (const char* name : {"img_in", "txt_in", "time_in_in_layer", "vector_in_out_layer", "guidance_in_in_layer",
                           "final_layer_linear", "double_blocks_0_img_mlp_2", "single_blocks_0_linear2"}) {
    rows = resolve(name);
    ASSERT_EQ(rows.size(), 1u) << name;
    ASSERT_TRUE(shapes.count(rows[0].module)) << name << " -> " << rows[0].module;
    EXPECT_EQ(rows[0].row_end - rows[0].row_begin, shapes.at(rows[0].module)[0]) << name;
  }
}

}  // namespace
}  // namespace fluxmpi::flux
