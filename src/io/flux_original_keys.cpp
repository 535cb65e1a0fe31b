#include "io/flux_original_keys.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

namespace fluxmpi::io {

namespace {

// A row count in units the config gives: inner_dim D, attention_head_dim, the final projection's
// width (patch_size^2 * out_channels).
enum class Unit { kInner, kHead, kOut };

struct Rows {
  int64_t times;
  Unit unit;
  int64_t resolve(const TransformerConfig& c) const {
    switch (unit) {
      case Unit::kInner: return times * c.inner_dim();
      case Unit::kHead: return times * c.attention_head_dim;
      case Unit::kOut: return times * c.patch_size * c.patch_size * c.out_channels;
    }
    return 0;
  }
};

constexpr Rows D(int64_t n) { return {n, Unit::kInner}; }
constexpr Rows kHeadRows{1, Unit::kHead};
constexpr Rows kOutRows{1, Unit::kOut};

// One diffusers module fed by rows [begin, end) of an original module, landing at `target`.
struct Entry {
  const char* original;
  const char* diffusers;
  Rows begin, end, target;
  bool norm;  // RMSNorm: stores "scale" (diffusers "weight"), no bias
};

Entry linear(const char* o, const char* d, Rows rows) { return {o, d, D(0), rows, D(0), false}; }
Entry slice(const char* o, const char* d, Rows begin, Rows end) { return {o, d, begin, end, D(0), false}; }
Entry rms(const char* o, const char* d) { return {o, d, D(0), kHeadRows, D(0), true}; }

// The FLUX MLPs are 4 * D wide (diffusers' FeedForward mult 4, the converter's mlp_ratio 4.0).
const std::vector<Entry>& double_block_entries() {
  static const std::vector<Entry> entries = {
      linear("img_mod.lin", "norm1.linear", D(6)),
      linear("txt_mod.lin", "norm1_context.linear", D(6)),
      slice("img_attn.qkv", "attn.to_q", D(0), D(1)),
      slice("img_attn.qkv", "attn.to_k", D(1), D(2)),
      slice("img_attn.qkv", "attn.to_v", D(2), D(3)),
      slice("txt_attn.qkv", "attn.add_q_proj", D(0), D(1)),
      slice("txt_attn.qkv", "attn.add_k_proj", D(1), D(2)),
      slice("txt_attn.qkv", "attn.add_v_proj", D(2), D(3)),
      rms("img_attn.norm.query_norm", "attn.norm_q"),
      rms("img_attn.norm.key_norm", "attn.norm_k"),
      rms("txt_attn.norm.query_norm", "attn.norm_added_q"),
      rms("txt_attn.norm.key_norm", "attn.norm_added_k"),
      linear("img_attn.proj", "attn.to_out.0", D(1)),
      linear("txt_attn.proj", "attn.to_add_out", D(1)),
      linear("img_mlp.0", "ff.net.0.proj", D(4)),
      linear("img_mlp.2", "ff.net.2", D(1)),
      linear("txt_mlp.0", "ff_context.net.0.proj", D(4)),
      linear("txt_mlp.2", "ff_context.net.2", D(1)),
  };
  return entries;
}

const std::vector<Entry>& single_block_entries() {
  static const std::vector<Entry> entries = {
      linear("modulation.lin", "norm.linear", D(3)),
      slice("linear1", "attn.to_q", D(0), D(1)),
      slice("linear1", "attn.to_k", D(1), D(2)),
      slice("linear1", "attn.to_v", D(2), D(3)),
      slice("linear1", "proj_mlp", D(3), D(7)),
      rms("norm.query_norm", "attn.norm_q"),
      rms("norm.key_norm", "attn.norm_k"),
      linear("linear2", "proj_out", D(1)),
  };
  return entries;
}

const std::vector<Entry>& top_entries() {
  static const std::vector<Entry> entries = {
      linear("img_in", "x_embedder", D(1)),
      linear("txt_in", "context_embedder", D(1)),
      linear("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1", D(1)),
      linear("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2", D(1)),
      linear("vector_in.in_layer", "time_text_embed.text_embedder.linear_1", D(1)),
      linear("vector_in.out_layer", "time_text_embed.text_embedder.linear_2", D(1)),
      linear("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1", D(1)),
      linear("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2", D(1)),
      linear("final_layer.linear", "proj_out", kOutRows),
      // Original (shift, scale) -> diffusers (scale, shift).
      {"final_layer.adaLN_modulation.1", "norm_out.linear", D(0), D(1), D(1), false},
      {"final_layer.adaLN_modulation.1", "norm_out.linear", D(1), D(2), D(0), false},
  };
  return entries;
}

bool is_guidance_entry(const Entry& e) { return std::string(e.original).rfind("guidance_in.", 0) == 0; }

enum class Scope { kTop, kDouble, kSingle };

struct Located {
  Scope scope = Scope::kTop;
  int64_t index = 0;
  std::string local;  // the name below the block prefix
};

// "<prefix><N>.<rest>" with N a canonical decimal below `count` -> N and rest.
std::optional<std::pair<int64_t, std::string>> block_of(const std::string& name, const std::string& prefix,
                                                        int64_t count) {
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  size_t i = prefix.size();
  size_t j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j - i > 9 || j >= name.size() || name[j] != '.') return std::nullopt;
  if (name[i] == '0' && j - i > 1) return std::nullopt;
  int64_t n = std::stoll(name.substr(i, j - i));
  if (n >= count) return std::nullopt;
  return std::make_pair(n, name.substr(j + 1));
}

// Splits a name into its block scope; nullopt for a block name outside the config's counts.
std::optional<Located> locate(const std::string& name, const std::string& double_prefix,
                              const std::string& single_prefix, const TransformerConfig& config) {
  Located out;
  if (name.compare(0, double_prefix.size(), double_prefix) == 0) {
    auto b = block_of(name, double_prefix, config.num_layers);
    if (!b) return std::nullopt;
    out.scope = Scope::kDouble;
    out.index = b->first;
    out.local = b->second;
  } else if (name.compare(0, single_prefix.size(), single_prefix) == 0) {
    auto b = block_of(name, single_prefix, config.num_single_layers);
    if (!b) return std::nullopt;
    out.scope = Scope::kSingle;
    out.index = b->first;
    out.local = b->second;
  } else {
    out.local = name;
  }
  return out;
}

const std::vector<Entry>& entries_of(Scope s) {
  switch (s) {
    case Scope::kDouble: return double_block_entries();
    case Scope::kSingle: return single_block_entries();
    case Scope::kTop: break;
  }
  return top_entries();
}

std::string original_prefix(const Located& at) {
  switch (at.scope) {
    case Scope::kDouble: return "double_blocks." + std::to_string(at.index) + ".";
    case Scope::kSingle: return "single_blocks." + std::to_string(at.index) + ".";
    case Scope::kTop: break;
  }
  return "";
}

std::string diffusers_prefix(const Located& at) {
  switch (at.scope) {
    case Scope::kDouble: return "transformer_blocks." + std::to_string(at.index) + ".";
    case Scope::kSingle: return "single_transformer_blocks." + std::to_string(at.index) + ".";
    case Scope::kTop: break;
  }
  return "";
}

bool applies(const Entry& e, const TransformerConfig& config) { return config.guidance_embeds || !is_guidance_entry(e); }

}  // namespace

std::vector<OriginalRows> flux_original_pieces(const std::string& diffusers_key, const TransformerConfig& config) {
  size_t dot = diffusers_key.rfind('.');
  if (dot == std::string::npos) return {};
  const std::string module = diffusers_key.substr(0, dot);
  const std::string param = diffusers_key.substr(dot + 1);
  if (param != "weight" && param != "bias") return {};
  auto at = locate(module, "transformer_blocks.", "single_transformer_blocks.", config);
  if (!at) return {};
  std::vector<std::pair<int64_t, OriginalRows>> found;
  for (const Entry& e : entries_of(at->scope)) {
    if (at->local != e.diffusers || !applies(e, config)) continue;
    if (e.norm && param != "weight") return {};
    OriginalRows rows;
    rows.original_key = original_prefix(*at) + e.original + "." + (e.norm ? "scale" : param);
    rows.row_begin = e.begin.resolve(config);
    rows.row_end = e.end.resolve(config);
    found.emplace_back(e.target.resolve(config), std::move(rows));
  }
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<OriginalRows> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::vector<DiffusersRows> flux_original_module_targets(const std::string& original_module,
                                                        const TransformerConfig& config) {
  auto at = locate(original_module, "double_blocks.", "single_blocks.", config);
  if (!at) return {};
  std::vector<DiffusersRows> out;
  for (const Entry& e : entries_of(at->scope)) {
    if (at->local != e.original || !applies(e, config)) continue;
    DiffusersRows rows;
    rows.diffusers_module = diffusers_prefix(*at) + e.diffusers;
    rows.row_begin = e.begin.resolve(config);
    rows.row_end = e.end.resolve(config);
    rows.target_row_begin = e.target.resolve(config);
    out.push_back(std::move(rows));
  }
  return out;
}

bool flux_original_is_norm_module(const std::string& original_module) {
  size_t n = original_module.size();
  auto ends_with = [&](const std::string& s) { return n >= s.size() && original_module.compare(n - s.size(), s.size(), s) == 0; };
  return ends_with(".query_norm") || ends_with(".key_norm");
}

std::vector<std::string> flux_original_keys(const TransformerConfig& config) {
  std::vector<std::string> out;
  auto add_scope = [&](const Located& at) {
    std::set<std::string> seen;
    for (const Entry& e : entries_of(at.scope)) {
      if (!applies(e, config) || !seen.insert(e.original).second) continue;
      const std::string base = original_prefix(at) + e.original;
      if (e.norm) {
        out.push_back(base + ".scale");
      } else {
        out.push_back(base + ".weight");
        out.push_back(base + ".bias");
      }
    }
  };
  add_scope(Located{Scope::kTop, 0, ""});
  for (int64_t i = 0; i < config.num_layers; ++i) add_scope(Located{Scope::kDouble, i, ""});
  for (int64_t i = 0; i < config.num_single_layers; ++i) add_scope(Located{Scope::kSingle, i, ""});
  return out;
}

}  // namespace fluxmpi::io
