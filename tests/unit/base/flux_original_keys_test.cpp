// The original (Black Forest Labs) FLUX key map against diffusers' converter: every key family at
// FLUX.1-dev width, and, on the fixtures, the tiny original-layout file mapped onto the diffusers
// folder byte for byte (both fp32; diffusers' own converter gave that folder from that file).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "io/flux_original_keys.h"
#include "io/model_dir.h"
#include "io/safetensors.h"
#include "io/tensor_store.h"
#include "support/fixtures.h"

namespace fluxmpi::io {
namespace {

TransformerConfig flux_dev() {
  TransformerConfig c;  // the defaults are FLUX.1's widths
  c.guidance_embeds = true;
  return c;
}

constexpr int64_t D = 3072;

std::string describe(const std::vector<OriginalRows>& pieces) {
  std::string s;
  for (const auto& p : pieces)
    s += p.original_key + "[" + std::to_string(p.row_begin) + "," + std::to_string(p.row_end) + ") ";
  return s;
}

void expect_pieces(const std::string& key, const std::vector<OriginalRows>& want,
                   const TransformerConfig& config = flux_dev()) {
  auto got = flux_original_pieces(key, config);
  ASSERT_EQ(got.size(), want.size()) << key << " -> " << describe(got);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].original_key, want[i].original_key) << key;
    EXPECT_EQ(got[i].row_begin, want[i].row_begin) << key << " piece " << i;
    EXPECT_EQ(got[i].row_end, want[i].row_end) << key << " piece " << i;
  }
}

TEST(FluxOriginalKeys, Embedders) {
  expect_pieces("x_embedder.weight", {{"img_in.weight", 0, D}});
  expect_pieces("x_embedder.bias", {{"img_in.bias", 0, D}});
  expect_pieces("context_embedder.weight", {{"txt_in.weight", 0, D}});
  expect_pieces("time_text_embed.timestep_embedder.linear_1.weight", {{"time_in.in_layer.weight", 0, D}});
  expect_pieces("time_text_embed.timestep_embedder.linear_2.bias", {{"time_in.out_layer.bias", 0, D}});
  expect_pieces("time_text_embed.text_embedder.linear_1.weight", {{"vector_in.in_layer.weight", 0, D}});
  expect_pieces("time_text_embed.text_embedder.linear_2.weight", {{"vector_in.out_layer.weight", 0, D}});
  expect_pieces("time_text_embed.guidance_embedder.linear_1.weight", {{"guidance_in.in_layer.weight", 0, D}});
  expect_pieces("time_text_embed.guidance_embedder.linear_2.bias", {{"guidance_in.out_layer.bias", 0, D}});
}

TEST(FluxOriginalKeys, GuidanceOnlyWithAGuidanceEmbedder) {
  TransformerConfig schnell;
  EXPECT_TRUE(flux_original_pieces("time_text_embed.guidance_embedder.linear_1.weight", schnell).empty());
  EXPECT_TRUE(flux_original_module_targets("guidance_in.in_layer", schnell).empty());
}

TEST(FluxOriginalKeys, DoubleBlocks) {
  expect_pieces("transformer_blocks.3.attn.to_q.weight", {{"double_blocks.3.img_attn.qkv.weight", 0, D}});
  expect_pieces("transformer_blocks.3.attn.to_k.weight", {{"double_blocks.3.img_attn.qkv.weight", D, 2 * D}});
  expect_pieces("transformer_blocks.3.attn.to_v.bias", {{"double_blocks.3.img_attn.qkv.bias", 2 * D, 3 * D}});
  expect_pieces("transformer_blocks.18.attn.add_q_proj.weight", {{"double_blocks.18.txt_attn.qkv.weight", 0, D}});
  expect_pieces("transformer_blocks.18.attn.add_k_proj.bias", {{"double_blocks.18.txt_attn.qkv.bias", D, 2 * D}});
  expect_pieces("transformer_blocks.18.attn.add_v_proj.weight",
                {{"double_blocks.18.txt_attn.qkv.weight", 2 * D, 3 * D}});
  expect_pieces("transformer_blocks.0.attn.norm_q.weight", {{"double_blocks.0.img_attn.norm.query_norm.scale", 0, 128}});
  expect_pieces("transformer_blocks.0.attn.norm_k.weight", {{"double_blocks.0.img_attn.norm.key_norm.scale", 0, 128}});
  expect_pieces("transformer_blocks.0.attn.norm_added_q.weight",
                {{"double_blocks.0.txt_attn.norm.query_norm.scale", 0, 128}});
  expect_pieces("transformer_blocks.0.attn.norm_added_k.weight",
                {{"double_blocks.0.txt_attn.norm.key_norm.scale", 0, 128}});
  expect_pieces("transformer_blocks.1.attn.to_out.0.weight", {{"double_blocks.1.img_attn.proj.weight", 0, D}});
  expect_pieces("transformer_blocks.1.attn.to_add_out.bias", {{"double_blocks.1.txt_attn.proj.bias", 0, D}});
  expect_pieces("transformer_blocks.2.ff.net.0.proj.weight", {{"double_blocks.2.img_mlp.0.weight", 0, 4 * D}});
  expect_pieces("transformer_blocks.2.ff.net.2.bias", {{"double_blocks.2.img_mlp.2.bias", 0, D}});
  expect_pieces("transformer_blocks.2.ff_context.net.0.proj.bias", {{"double_blocks.2.txt_mlp.0.bias", 0, 4 * D}});
  expect_pieces("transformer_blocks.2.ff_context.net.2.weight", {{"double_blocks.2.txt_mlp.2.weight", 0, D}});
  expect_pieces("transformer_blocks.4.norm1.linear.weight", {{"double_blocks.4.img_mod.lin.weight", 0, 6 * D}});
  expect_pieces("transformer_blocks.4.norm1_context.linear.bias", {{"double_blocks.4.txt_mod.lin.bias", 0, 6 * D}});
}

TEST(FluxOriginalKeys, SingleBlocks) {
  expect_pieces("single_transformer_blocks.7.attn.to_q.weight", {{"single_blocks.7.linear1.weight", 0, D}});
  expect_pieces("single_transformer_blocks.7.attn.to_k.bias", {{"single_blocks.7.linear1.bias", D, 2 * D}});
  expect_pieces("single_transformer_blocks.7.attn.to_v.weight", {{"single_blocks.7.linear1.weight", 2 * D, 3 * D}});
  expect_pieces("single_transformer_blocks.7.proj_mlp.weight", {{"single_blocks.7.linear1.weight", 3 * D, 7 * D}});
  expect_pieces("single_transformer_blocks.37.proj_mlp.bias", {{"single_blocks.37.linear1.bias", 3 * D, 7 * D}});
  expect_pieces("single_transformer_blocks.0.attn.norm_q.weight", {{"single_blocks.0.norm.query_norm.scale", 0, 128}});
  expect_pieces("single_transformer_blocks.0.attn.norm_k.weight", {{"single_blocks.0.norm.key_norm.scale", 0, 128}});
  expect_pieces("single_transformer_blocks.5.proj_out.weight", {{"single_blocks.5.linear2.weight", 0, D}});
  expect_pieces("single_transformer_blocks.5.norm.linear.bias", {{"single_blocks.5.modulation.lin.bias", 0, 3 * D}});
}

TEST(FluxOriginalKeys, FinalLayerSwapsShiftAndScale) {
  expect_pieces("norm_out.linear.weight", {{"final_layer.adaLN_modulation.1.weight", D, 2 * D},
                                           {"final_layer.adaLN_modulation.1.weight", 0, D}});
  expect_pieces("norm_out.linear.bias", {{"final_layer.adaLN_modulation.1.bias", D, 2 * D},
                                         {"final_layer.adaLN_modulation.1.bias", 0, D}});
  expect_pieces("proj_out.weight", {{"final_layer.linear.weight", 0, 64}});
  expect_pieces("proj_out.bias", {{"final_layer.linear.bias", 0, 64}});
}

TEST(FluxOriginalKeys, KeysWithoutCounterpart) {
  const auto c = flux_dev();
  for (const char* key : {"transformer_blocks.19.attn.to_q.weight",  // beyond num_layers
                          "single_transformer_blocks.38.proj_out.weight", "transformer_blocks.03.attn.to_q.weight",
                          "transformer_blocks.x.attn.to_q.weight", "transformer_blocks.0.attn.norm_q.bias",
                          "transformer_blocks.0.attn.to_q.scale", "transformer_blocks.0.attn.to_q", "pos_embed.weight",
                          "double_blocks.0.img_attn.qkv.weight", ""})
    EXPECT_TRUE(flux_original_pieces(key, c).empty()) << key;
}

TEST(FluxOriginalKeys, ModuleTargetsOfFusedModules) {
  const auto c = flux_dev();
  auto qkv = flux_original_module_targets("double_blocks.3.img_attn.qkv", c);
  ASSERT_EQ(qkv.size(), 3u);
  EXPECT_EQ(qkv[0].diffusers_module, "transformer_blocks.3.attn.to_q");
  EXPECT_EQ(qkv[1].diffusers_module, "transformer_blocks.3.attn.to_k");
  EXPECT_EQ(qkv[2].diffusers_module, "transformer_blocks.3.attn.to_v");
  EXPECT_EQ(qkv[1].row_begin, D);
  EXPECT_EQ(qkv[1].row_end, 2 * D);
  EXPECT_EQ(qkv[1].target_row_begin, 0);

  auto txt = flux_original_module_targets("double_blocks.3.txt_attn.qkv", c);
  ASSERT_EQ(txt.size(), 3u);
  EXPECT_EQ(txt[2].diffusers_module, "transformer_blocks.3.attn.add_v_proj");
  EXPECT_EQ(txt[2].row_begin, 2 * D);

  auto lin1 = flux_original_module_targets("single_blocks.7.linear1", c);
  ASSERT_EQ(lin1.size(), 4u);
  EXPECT_EQ(lin1[3].diffusers_module, "single_transformer_blocks.7.proj_mlp");
  EXPECT_EQ(lin1[3].row_begin, 3 * D);
  EXPECT_EQ(lin1[3].row_end, 7 * D);

  auto mod = flux_original_module_targets("single_blocks.7.modulation.lin", c);
  ASSERT_EQ(mod.size(), 1u);
  EXPECT_EQ(mod[0].diffusers_module, "single_transformer_blocks.7.norm.linear");
  EXPECT_EQ(mod[0].row_end, 3 * D);

  auto fin = flux_original_module_targets("final_layer.adaLN_modulation.1", c);
  ASSERT_EQ(fin.size(), 2u);
  EXPECT_EQ(fin[0].diffusers_module, "norm_out.linear");
  EXPECT_EQ(fin[0].row_begin, 0);  // shift ...
  EXPECT_EQ(fin[0].target_row_begin, D);  // ... is diffusers' second half
  EXPECT_EQ(fin[1].row_begin, D);
  EXPECT_EQ(fin[1].target_row_begin, 0);

  auto norm = flux_original_module_targets("double_blocks.0.txt_attn.norm.key_norm", c);
  ASSERT_EQ(norm.size(), 1u);
  EXPECT_EQ(norm[0].diffusers_module, "transformer_blocks.0.attn.norm_added_k");
  EXPECT_TRUE(flux_original_is_norm_module("double_blocks.0.txt_attn.norm.key_norm"));
  EXPECT_FALSE(flux_original_is_norm_module("double_blocks.0.txt_attn.qkv"));

  for (const char* name : {"double_blocks.19.img_attn.qkv", "single_blocks.38.linear1", "double_blocks.3.img_attn.qkv.weight",
                           "transformer_blocks.3.attn.to_q", "double_blocks.3", "img_in.weight"})
    EXPECT_TRUE(flux_original_module_targets(name, c).empty()) << name;
}

// Every diffusers key maps to pieces, the inverse agrees, and the pieces cover each original
// tensor's rows exactly once.
TEST(FluxOriginalKeys, MapIsABijectionOnRows) {
  for (bool guidance : {true, false}) {
    TransformerConfig c = flux_dev();
    c.guidance_embeds = guidance;
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> covered;
    std::set<std::string> modules;
    for (const auto& key : flux_original_keys(c)) {
      std::string module = key.substr(0, key.rfind('.'));
      modules.insert(module);
    }
    for (const auto& module : modules) {
      auto targets = flux_original_module_targets(module, c);
      ASSERT_FALSE(targets.empty()) << module;
      for (const auto& t : targets) {
        for (const char* param : {"weight", "bias"}) {
          const bool norm = flux_original_is_norm_module(module);
          if (norm && std::string(param) == "bias") continue;
          auto pieces = flux_original_pieces(t.diffusers_module + "." + param, c);
          ASSERT_FALSE(pieces.empty()) << t.diffusers_module;
          int64_t at = 0;
          for (const auto& p : pieces) {
            EXPECT_EQ(p.original_key, module + "." + (norm ? "scale" : param));
            if (p.row_begin == t.row_begin) EXPECT_EQ(at, t.target_row_begin) << t.diffusers_module;
            covered[p.original_key].emplace_back(p.row_begin, p.row_end);
            at += p.row_end - p.row_begin;
          }
        }
      }
    }
    EXPECT_EQ(covered.size(), flux_original_keys(c).size());
    for (auto& [key, ranges] : covered) {
      std::sort(ranges.begin(), ranges.end());
      ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
      int64_t next = 0;
      for (const auto& r : ranges) {
        EXPECT_EQ(r.first, next) << key;
        next = r.second;
      }
    }
    // 19 double blocks x 24 tensors, 38 single x 8, embedders and final layer.
    EXPECT_EQ(flux_original_keys(c).size(), size_t(19 * 24 + 38 * 8 + 16 + (guidance ? 4 : 0)));
  }
}

// The fixture: flux1-tiny-dev.safetensors holds tiny-flux-dev's transformer in the original
// layout. Every diffusers tensor, assembled from its pieces, equals the diffusers file byte for byte.
TEST(FluxOriginalKeys, TinyFixtureMatchesTheDiffusersFolder) {
  FLUXMPI_REQUIRE_FIXTURES();
  namespace fs = std::filesystem;
  const fs::path root = test::fixture_root();
  const std::string original_path = (root / "single-file/tiny-flux-dev/flux1-tiny-dev.safetensors").string();
  FLUXMPI_REQUIRE_ASSET(original_path, "single-file fixture");
  ModelDir dir((root / "tiny-flux-dev").string());
  const TransformerConfig& config = dir.transformer_config();
  TensorStore diffusers = dir.open_weights("transformer");
  SafetensorsFile original(original_path);

  std::set<std::string> used;
  for (const auto& key : diffusers.keys()) {
    auto pieces = flux_original_pieces(key, config);
    ASSERT_FALSE(pieces.empty()) << key;
    TensorView want = diffusers.get(key);
    ASSERT_EQ(want.entry->dtype, DType::F32);
    const int64_t row_bytes = static_cast<int64_t>(want.entry->num_bytes()) / want.entry->shape[0];
    int64_t offset = 0;
    for (const auto& p : pieces) {
      const TensorEntry* e = original.find(p.original_key);
      ASSERT_NE(e, nullptr) << p.original_key;
      ASSERT_EQ(e->dtype, DType::F32);
      ASSERT_LE(p.row_end, e->shape[0]) << p.original_key;
      const int64_t n = (p.row_end - p.row_begin) * row_bytes;
      EXPECT_EQ(std::memcmp(original.data(*e) + p.row_begin * row_bytes, want.data() + offset, n), 0)
          << key << " <- " << p.original_key << " rows [" << p.row_begin << ", " << p.row_end << ")";
      offset += n;
      used.insert(p.original_key);
    }
    EXPECT_EQ(offset, static_cast<int64_t>(want.entry->num_bytes())) << key;
  }
  std::set<std::string> expected;
  for (const auto& k : flux_original_keys(config)) expected.insert(k);
  std::set<std::string> stored;
  for (const auto& e : original.header().tensors) stored.insert(e.name);
  EXPECT_EQ(used, stored);
  EXPECT_EQ(expected, stored);
}

}  // namespace
}  // namespace fluxmpi::io
