#include "models/flux/lora_targets.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "io/flux_original_keys.h"
#include "models/flux/embeddings.h"

namespace fluxmpi::flux {

nn::WeightShapes flux_linear_shapes(const io::TransformerConfig& c) {
  // The layers the modules of src/models/flux register (tests/unit/flux_lora_targets_test.cpp holds
  // this table to the modules' own parameters).
  const int64_t D = c.inner_dim(), mlp = 4 * D, T = TimeTextEmbedImpl::kProjectionChannels;
  nn::WeightShapes s;
  s["x_embedder"] = {D, c.in_channels};
  s["context_embedder"] = {D, c.joint_attention_dim};
  s["time_text_embed.timestep_embedder.linear_1"] = {D, T};
  s["time_text_embed.timestep_embedder.linear_2"] = {D, D};
  if (c.guidance_embeds) {
    s["time_text_embed.guidance_embedder.linear_1"] = {D, T};
    s["time_text_embed.guidance_embedder.linear_2"] = {D, D};
  }
  s["time_text_embed.text_embedder.linear_1"] = {D, c.pooled_projection_dim};
  s["time_text_embed.text_embedder.linear_2"] = {D, D};
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    s[b + "norm1.linear"] = {6 * D, D};
    s[b + "norm1_context.linear"] = {6 * D, D};
    for (const char* m : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"})
      s[b + "attn." + m] = {D, D};
    for (const char* ff : {"ff", "ff_context"}) {
      s[b + ff + ".net.0.proj"] = {mlp, D};
      s[b + ff + ".net.2"] = {D, mlp};
    }
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".";
    s[b + "norm.linear"] = {3 * D, D};
    for (const char* m : {"to_q", "to_k", "to_v"}) s[b + "attn." + m] = {D, D};
    s[b + "proj_mlp"] = {mlp, D};
    s[b + "proj_out"] = {D, D + mlp};
  }
  s["norm_out.linear"] = {2 * D, D};
  s["proj_out"] = {c.patch_size * c.patch_size * c.out_channels, D};
  return s;
}

nn::KohyaResolver flux_kohya_resolver(const io::TransformerConfig& config) {
  // kohya writes the original module names with '.' as '_': the names of this config's original
  // modules, underscored, say which dots they stand for ("double_blocks_3_img_attn_qkv").
  auto modules = std::make_shared<std::map<std::string, std::string>>();
  for (const std::string& key : io::flux_original_keys(config)) {
    const std::string module = key.substr(0, key.rfind('.'));
    std::string name = module;
    std::replace(name.begin(), name.end(), '.', '_');
    (*modules)[name] = module;
  }
  return [modules, config](const std::string& name) -> std::vector<nn::LoraRows> {
    auto it = modules->find(name);
    if (it == modules->end()) return {};
    std::vector<nn::LoraRows> rows;
    for (const io::DiffusersRows& t : io::flux_original_module_targets(it->second, config))
      rows.push_back(nn::LoraRows{t.diffusers_module, t.row_begin, t.row_end, t.target_row_begin});
    return rows;
  };
}

nn::LoraSet flux_lora_set(const std::vector<std::shared_ptr<const io::LoraFile>>& files,
                          const io::TransformerConfig& config) {
  return nn::LoraSet(files, io::LoraTarget::Transformer, flux_linear_shapes(config), flux_kohya_resolver(config));
}

}  // namespace fluxmpi::flux
