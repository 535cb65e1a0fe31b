#include "io/flux2_original_keys.h"

#include <cctype>
#include <optional>

namespace fluxmpi::io {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// "<prefix>N.<rest>" with a canonical decimal N below `count`: N and rest.
std::optional<std::pair<int64_t, std::string>> block_of(const std::string& key, const std::string& prefix, int64_t count) {
  if (!starts_with(key, prefix)) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < key.size() && std::isdigit(static_cast<unsigned char>(key[j]))) ++j;
  if (j == i || j - i > 9 || j >= key.size() || key[j] != '.' || (key[i] == '0' && j - i > 1)) return std::nullopt;
  const int64_t n = std::stoll(key.substr(i, j - i));
  if (n >= count) return std::nullopt;
  return std::make_pair(n, key.substr(j + 1));
}

// Diffusers module (below the block prefix) -> original module, for the modules stored whole.
struct Rename {
  const char* diffusers;
  const char* original;
};

constexpr Rename kTop[] = {
    {"x_embedder", "img_in"},
    {"context_embedder", "txt_in"},
    {"time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer"},
    {"time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer"},
    {"time_guidance_embed.guidance_embedder.linear_1", "guidance_in.in_layer"},
    {"time_guidance_embed.guidance_embedder.linear_2", "guidance_in.out_layer"},
    {"double_stream_modulation_img.linear", "double_stream_modulation_img.lin"},
    {"double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin"},
    {"single_stream_modulation.linear", "single_stream_modulation.lin"},
    {"proj_out", "final_layer.linear"},
};

constexpr Rename kDouble[] = {
    {"attn.to_out.0", "img_attn.proj"},     {"attn.to_add_out", "txt_attn.proj"},
    {"ff.linear_in", "img_mlp.0"},          {"ff.linear_out", "img_mlp.2"},
    {"ff_context.linear_in", "txt_mlp.0"},  {"ff_context.linear_out", "txt_mlp.2"},
};

constexpr Rename kDoubleNorms[] = {
    {"attn.norm_q", "img_attn.norm.query_norm"},       {"attn.norm_k", "img_attn.norm.key_norm"},
    {"attn.norm_added_q", "txt_attn.norm.query_norm"}, {"attn.norm_added_k", "txt_attn.norm.key_norm"},
};

constexpr Rename kSingle[] = {{"attn.to_qkv_mlp_proj", "linear1"}, {"attn.to_out", "linear2"}};
constexpr Rename kSingleNorms[] = {{"attn.norm_q", "norm.query_norm"}, {"attn.norm_k", "norm.key_norm"}};

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> flux2_diffusers_shapes(const Flux2TransformerConfig& c) {
  const int64_t D = c.inner_dim(), Dh = c.attention_head_dim, F = c.mlp_hidden_dim();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) { out.push_back({name + ".weight", {rows, cols}}); };
  matrix("x_embedder", D, c.in_channels);
  matrix("context_embedder", D, c.joint_attention_dim);
  matrix("time_guidance_embed.timestep_embedder.linear_1", D, c.timestep_guidance_channels);
  matrix("time_guidance_embed.timestep_embedder.linear_2", D, D);
  if (c.guidance_embeds) {
    matrix("time_guidance_embed.guidance_embedder.linear_1", D, c.timestep_guidance_channels);
    matrix("time_guidance_embed.guidance_embedder.linear_2", D, D);
  }
  matrix("double_stream_modulation_img.linear", 6 * D, D);
  matrix("double_stream_modulation_txt.linear", 6 * D, D);
  matrix("single_stream_modulation.linear", 3 * D, D);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    for (const char* p : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"})
      matrix(b + "attn." + p, D, D);
    for (const char* n : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"}) out.push_back({b + "attn." + n + ".weight", {Dh}});
    matrix(b + "ff.linear_in", 2 * F, D);
    matrix(b + "ff.linear_out", D, F);
    matrix(b + "ff_context.linear_in", 2 * F, D);
    matrix(b + "ff_context.linear_out", D, F);
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".attn.";
    matrix(b + "to_qkv_mlp_proj", 3 * D + 2 * F, D);
    out.push_back({b + "norm_q.weight", {Dh}});
    out.push_back({b + "norm_k.weight", {Dh}});
    matrix(b + "to_out", D, D + F);
  }
  matrix("norm_out.linear", 2 * D, D);
  matrix("proj_out", c.patch_size * c.patch_size * c.out_channels, D);
  return out;
}

std::vector<OriginalRows> flux2_original_pieces(const std::string& key, const Flux2TransformerConfig& c) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos || key.substr(dot + 1) != "weight") return {};
  const std::string module = key.substr(0, dot);
  const int64_t D = c.inner_dim();
  auto whole = [](const std::string& original, const char* param) {
    return std::vector<OriginalRows>{{original + "." + param, 0, -1}};
  };
  if (auto b = block_of(module, "transformer_blocks.", c.num_layers)) {
    const std::string p = "double_blocks." + std::to_string(b->first) + ".";
    const std::string& local = b->second;
    for (const auto& r : kDouble)
      if (local == r.diffusers) return whole(p + r.original, "weight");
    for (const auto& r : kDoubleNorms)
      if (local == r.diffusers) return whole(p + r.original, "scale");
    static const char* const kImg[] = {"attn.to_q", "attn.to_k", "attn.to_v"};
    static const char* const kTxt[] = {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
    for (int64_t i = 0; i < 3; ++i) {
      if (local == kImg[i]) return {{p + "img_attn.qkv.weight", i * D, (i + 1) * D}};
      if (local == kTxt[i]) return {{p + "txt_attn.qkv.weight", i * D, (i + 1) * D}};
    }
    return {};
  }
  if (auto b = block_of(module, "single_transformer_blocks.", c.num_single_layers)) {
    const std::string p = "single_blocks." + std::to_string(b->first) + ".";
    for (const auto& r : kSingle)
      if (b->second == r.diffusers) return whole(p + r.original, "weight");
    for (const auto& r : kSingleNorms)
      if (b->second == r.diffusers) return whole(p + r.original, "scale");
    return {};
  }
  if (starts_with(module, "transformer_blocks.") || starts_with(module, "single_transformer_blocks.")) return {};
  if (module == "norm_out.linear")  // original (shift, scale) -> diffusers (scale, shift)
    return {{"final_layer.adaLN_modulation.1.weight", D, 2 * D}, {"final_layer.adaLN_modulation.1.weight", 0, D}};
  if (!c.guidance_embeds && starts_with(module, "time_guidance_embed.guidance_embedder.")) return {};
  for (const auto& r : kTop)
    if (module == r.diffusers) return whole(r.original, "weight");
  return {};
}

}  // namespace fluxmpi::io
