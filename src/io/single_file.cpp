#include "io/single_file.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "io/flux2_original_keys.h"
#include "io/flux_original_keys.h"

namespace fluxmpi::io {

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool any_key_starts_with(const SafetensorsHeader& h, const std::string& prefix) {
  // Tensors are sorted by name: the first key not below the prefix decides.
  auto it = std::lower_bound(h.tensors.begin(), h.tensors.end(), prefix,
                             [](const TensorEntry& e, const std::string& p) { return e.name < p; });
  return it != h.tensors.end() && starts_with(it->name, prefix);
}

// "<prefix>N.<rest>" with a canonical decimal N: N and rest.
std::optional<std::pair<int64_t, std::string>> numbered(const std::string& key, const std::string& prefix) {
  if (!starts_with(key, prefix)) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < key.size() && std::isdigit(static_cast<unsigned char>(key[j]))) ++j;
  if (j == i || j - i > 9 || j >= key.size() || key[j] != '.' || (key[i] == '0' && j - i > 1)) return std::nullopt;
  return std::make_pair(std::stoll(key.substr(i, j - i)), key.substr(j + 1));
}

// The keys of a component: under its prefix, and for a bare component not under another
// component's prefix. Local names (prefix removed), sorted.
std::vector<std::string> component_keys(const SafetensorsHeader& header, const ComponentInFile& found) {
  std::vector<std::string> others;
  if (found.prefix.empty())
    for (const auto& c : detect_components(header))
      if (!c.prefix.empty()) others.push_back(c.prefix);
  std::vector<std::string> out;
  for (const auto& e : header.tensors) {
    if (!starts_with(e.name, found.prefix)) continue;
    bool other = false;
    for (const auto& p : others) other = other || starts_with(e.name, p);
    if (!other) out.push_back(e.name.substr(found.prefix.size()));
  }
  return out;
}

// Blocks "<family>.N.*" must be numbered 0..N-1 without a gap, N as the config says.
void check_block_numbers(const std::vector<std::string>& keys, const std::string& family, int64_t expected,
                         const char* config_key, const std::string& file_label, const std::string& config_label) {
  std::set<int64_t> seen;
  for (const auto& k : keys)
    if (auto b = numbered(k, family + ".")) seen.insert(b->first);
  const int64_t count = seen.empty() ? 0 : *seen.rbegin() + 1;
  for (int64_t i = 0; i < count; ++i)
    if (!seen.count(i))
      throw WeightError(str_cat(file_label, ": the blocks skip a number: no tensor '", family, ".", i, ".*' between ",
                                family, ".0 and ", family, ".", count - 1));
  if (count != expected)
    throw WeightError(str_cat(file_label, ": holds ", count, " ", family, " (", family, ".0-", count - 1, ") but ",
                              config_label, " says '", config_key, "' ", expected));
}

// Every stored tensor a map reads, with the shape the config's widths give it.
void check_stored_shapes(const SafetensorsHeader& header, const std::map<std::string, std::vector<int64_t>>& expected,
                         const LayoutConfigs& cfg, const std::string& label) {
  for (const auto& [stored, want] : expected) {
    const TensorEntry* e = header.find(stored);
    if (e == nullptr)
      throw WeightError(str_cat(label, ": tensor '", stored, "' not found (expected shape ", shape_text(want), ")"));
    if (e->shape != want)
      throw WeightError(str_cat(label, ": tensor '", stored, "' has shape ", shape_text(e->shape), ", expected ",
                                shape_text(want), " (the widths of ", cfg.transformer_label, ")"));
  }
}

std::vector<PresentedTensor> map_original_transformer(const SafetensorsHeader& header, const ComponentInFile& found,
                                                      const std::vector<std::string>& keys, const LayoutConfigs& cfg,
                                                      const std::string& label) {
  FLUX_CHECK(cfg.transformer != nullptr, "the original layout needs the transformer config");
  const TransformerConfig& config = *cfg.transformer;
  check_block_numbers(keys, "double_blocks", config.num_layers, "num_layers", label, cfg.transformer_label);
  check_block_numbers(keys, "single_blocks", config.num_single_layers, "num_single_layers", label, cfg.transformer_label);
  std::set<std::string> diffusers_keys;
  for (const auto& k : keys) {
    const size_t dot = k.rfind('.');
    const std::string module = dot == std::string::npos ? k : k.substr(0, dot);
    const std::string param = dot == std::string::npos ? "" : k.substr(dot + 1);
    if (starts_with(k, "guidance_in.") && !config.guidance_embeds)
      throw WeightError(str_cat(label, ": holds a guidance embedder ('", found.prefix, k, "') but ",
                                cfg.transformer_label, " says 'guidance_embeds' false"));
    auto targets = flux_original_module_targets(module, config);
    const bool norm = flux_original_is_norm_module(module);
    const bool param_ok = norm ? param == "scale" : (param == "weight" || param == "bias");
    if (targets.empty() || !param_ok)
      throw WeightError(str_cat(label, ": unexpected tensor '", found.prefix, k,
                                "': not a key of the original FLUX transformer layout"));
    for (const auto& t : targets) diffusers_keys.insert(t.diffusers_module + "." + (norm ? "weight" : param));
  }
  if (config.guidance_embeds && !any_key_starts_with(header, found.prefix + "guidance_in."))
    throw WeightError(str_cat(label, ": has no guidance embedder ('", found.prefix, "guidance_in.*') but ",
                              cfg.transformer_label, " says 'guidance_embeds' true"));
  // The config's widths fix each stored tensor's shape: its rows from the pieces cut out of it,
  // its other dims from the diffusers tensors they make.
  std::map<std::string, std::vector<int64_t>> diffusers_shape;
  for (auto& [key, shape] : flux_diffusers_shapes(config)) diffusers_shape[key] = shape;
  std::map<std::string, std::vector<int64_t>> expected;
  std::vector<PresentedTensor> out;
  for (const auto& key : diffusers_keys) {
    PresentedTensor t;
    t.key = key;
    for (const auto& p : flux_original_pieces(key, config)) {
      const std::string stored = found.prefix + p.original_key;
      t.rows.push_back({stored, p.row_begin, p.row_end});
      std::vector<int64_t>& want = expected[stored];
      if (want.empty()) {
        want = diffusers_shape.at(key);  // every mapped key is a tensor of the configured model
        want[0] = 0;
      }
      want[0] = std::max(want[0], p.row_end);
    }
    out.push_back(std::move(t));
  }
  check_stored_shapes(header, expected, cfg, label);
  return out;
}

// FLUX.2's original layout, driven by the config: every diffusers tensor of the configured model
// is found in its stored tensors, and every stored tensor of the component must be one of them.
std::vector<PresentedTensor> map_original_flux2_transformer(const SafetensorsHeader& header, const ComponentInFile& found,
                                                            const std::vector<std::string>& keys, const LayoutConfigs& cfg,
                                                            const std::string& label) {
  const Flux2TransformerConfig& config = *cfg.flux2;
  check_block_numbers(keys, "double_blocks", config.num_layers, "num_layers", label, cfg.transformer_label);
  check_block_numbers(keys, "single_blocks", config.num_single_layers, "num_single_layers", label, cfg.transformer_label);
  const bool guidance = any_key_starts_with(header, found.prefix + "guidance_in.");
  if (guidance != config.guidance_embeds)
    throw WeightError(str_cat(label, guidance ? ": holds a guidance embedder ('" : ": has no guidance embedder ('",
                              found.prefix, "guidance_in.*') but ", cfg.transformer_label, " says 'guidance_embeds' ",
                              config.guidance_embeds ? "true" : "false"));
  std::set<std::string> used;
  std::map<std::string, std::vector<int64_t>> expected;
  std::vector<PresentedTensor> out;
  for (const auto& [key, shape] : flux2_diffusers_shapes(config)) {
    PresentedTensor t;
    t.key = key;
    for (const auto& p : flux2_original_pieces(key, config)) {
      const std::string stored = found.prefix + p.original_key;
      t.rows.push_back({stored, p.row_begin, p.row_end});
      used.insert(p.original_key);
      std::vector<int64_t>& want = expected[stored];
      if (want.empty()) {
        want = shape;
        want[0] = 0;
      }
      want[0] = std::max(want[0], p.row_end < 0 ? shape[0] : p.row_end);
    }
    out.push_back(std::move(t));
  }
  for (const auto& k : keys)
    if (!used.count(k))
      throw WeightError(str_cat(label, ": unexpected tensor '", found.prefix, k,
                                "': not a key of the original FLUX.2 transformer layout of ", cfg.transformer_label));
  check_stored_shapes(header, expected, cfg, label);
  return out;
}

// LDM resnet names: nin_shortcut is diffusers' conv_shortcut; norm1, conv1, norm2, conv2 stay.
std::string ldm_resnet(const std::string& rest) {
  if (starts_with(rest, "nin_shortcut.")) return "conv_shortcut." + rest.substr(13);
  return rest;
}

std::vector<PresentedTensor> map_ldm_vae(const SafetensorsHeader& header, const ComponentInFile& found,
                                         const std::vector<std::string>& keys, const LayoutConfigs& cfg,
                                         const std::string& label) {
  FLUX_CHECK(cfg.vae != nullptr, "the LDM layout needs the VAE config");
  const int64_t levels = static_cast<int64_t>(cfg.vae->block_out_channels.size());
  std::vector<PresentedTensor> out;
  for (const auto& k : keys) {
    std::string mapped;
    std::vector<int64_t> shape;
    const TensorEntry* e = header.find(found.prefix + k);
    // The two halves share their names below the side: conv_in, norm_out, mid.*, conv_out.
    const std::string side = starts_with(k, "encoder.") ? "encoder." : starts_with(k, "decoder.") ? "decoder." : "";
    const std::string r = k.substr(side.size());
    if (side.empty()) {
      mapped = k;  // quant_conv.*, post_quant_conv.*: the same names in diffusers
    } else if (starts_with(r, "conv_in.") || starts_with(r, "conv_out.")) {
      mapped = k;
    } else if (starts_with(r, "norm_out.")) {
      mapped = side + "conv_norm_out." + r.substr(9);
    } else if (starts_with(r, "mid.block_1.")) {
      mapped = side + "mid_block.resnets.0." + ldm_resnet(r.substr(12));
    } else if (starts_with(r, "mid.block_2.")) {
      mapped = side + "mid_block.resnets.1." + ldm_resnet(r.substr(12));
    } else if (starts_with(r, "mid.attn_1.")) {
      const std::string rest = r.substr(11);
      static const std::pair<const char*, const char*> names[] = {
          {"norm.", "group_norm."}, {"q.", "to_q."}, {"k.", "to_k."}, {"v.", "to_v."}, {"proj_out.", "to_out.0."}};
      for (const auto& [from, to] : names)
        if (starts_with(rest, from)) mapped = side + "mid_block.attentions.0." + std::string(to) + rest.substr(std::string(from).size());
      // The LDM attention projections are 1x1 convolutions; diffusers' are linear layers.
      if (!mapped.empty() && e->shape.size() == 4 && e->shape[2] == 1 && e->shape[3] == 1)
        shape = {e->shape[0], e->shape[1]};
    } else if (auto level = numbered(r, side == "decoder." ? "up." : "down.")) {
      if (level->first >= levels)
        throw WeightError(str_cat(label, ": tensor '", found.prefix, k, "' is in ", side == "decoder." ? "up" : "down", " level ",
                                  level->first, " but ", cfg.vae_label, " has ", levels, " levels ('block_out_channels')"));
      // The decoder's LDM levels count from the bottom, diffusers' up_blocks from the top; the
      // encoder's down levels are numbered alike in both.
      const std::string block = side == "decoder." ? str_cat("decoder.up_blocks.", levels - 1 - level->first, ".")
                                                   : str_cat("encoder.down_blocks.", level->first, ".");
      const char* resample = side == "decoder." ? "upsample.conv." : "downsample.conv.";
      const char* resampler = side == "decoder." ? "upsamplers.0.conv." : "downsamplers.0.conv.";
      if (auto res = numbered(level->second, "block.")) mapped = block + "resnets." + std::to_string(res->first) + "." + ldm_resnet(res->second);
      else if (starts_with(level->second, resample)) mapped = block + resampler + level->second.substr(std::string(resample).size());
    }
    if (mapped.empty())
      throw WeightError(str_cat(label, ": unexpected tensor '", found.prefix, k, "': not a key of the LDM VAE layout"));
    out.push_back(PresentedTensor{mapped, {{found.prefix + k, 0, -1}}, shape});
  }
  return out;
}

bool is_scaled_fp8_marker(const std::string& key) {
  return key == "scaled_fp8" || (key.size() > 13 && key.compare(key.size() - 13, 13, ".scale_weight") == 0);
}

}  // namespace

const char* component_name(Component c) {
  switch (c) {
    case Component::Transformer: return "transformer";
    case Component::Vae: return "vae";
    case Component::TextEncoder: return "text_encoder";
    case Component::TextEncoder2: return "text_encoder_2";
  }
  return "?";
}

const char* component_option(Component c) {
  switch (c) {
    case Component::Transformer: return "--transformer";
    case Component::Vae: return "--vae";
    case Component::TextEncoder: return "--text-encoder";
    case Component::TextEncoder2: return "--text-encoder-2";
  }
  return "?";
}

std::string describe_layout(const ComponentInFile& c) {
  std::string what;
  switch (c.layout) {
    case KeyLayout::OriginalFlux: what = "original FLUX keys"; break;
    case KeyLayout::Ldm: what = "LDM keys"; break;
    case KeyLayout::Diffusers:
      what = c.component == Component::TextEncoder || c.component == Component::TextEncoder2 ? "transformers keys"
                                                                                            : "diffusers keys";
      break;
  }
  return c.prefix.empty() ? what : str_cat(what, " under '", c.prefix, "'");
}

std::vector<ComponentInFile> detect_components(const SafetensorsHeader& h) {
  std::vector<ComponentInFile> out;
  auto has = [&](const std::string& p) { return any_key_starts_with(h, p); };
  for (const char* p : {"model.diffusion_model.", "diffusion_model.", ""}) {
    const std::string P = p;
    if (has(P + "double_blocks.") || has(P + "single_blocks.") || has(P + "img_in.")) {
      out.push_back({Component::Transformer, P, KeyLayout::OriginalFlux});
      break;
    }
  }
  if (out.empty() && (has("transformer_blocks.") || has("single_transformer_blocks.") || has("x_embedder.")))
    out.push_back({Component::Transformer, "", KeyLayout::Diffusers});
  bool vae = false;
  for (const char* p : {"vae.", "first_stage_model.", ""}) {
    const std::string P = p;
    if (has(P + "decoder.mid.") || has(P + "decoder.up.") || has(P + "decoder.norm_out.")) {
      out.push_back({Component::Vae, P, KeyLayout::Ldm});
      vae = true;
      break;
    }
  }
  if (!vae && (has("decoder.up_blocks.") || has("decoder.mid_block.")))
    out.push_back({Component::Vae, "", KeyLayout::Diffusers});
  for (const char* p : {"text_encoders.clip_l.transformer.", ""}) {
    if (has(std::string(p) + "text_model.encoder.layers.")) {
      out.push_back({Component::TextEncoder, p, KeyLayout::Diffusers});
      break;
    }
  }
  for (const char* p : {"text_encoders.t5xxl.transformer.", ""}) {
    if (has(std::string(p) + "encoder.block.")) {
      out.push_back({Component::TextEncoder2, p, KeyLayout::Diffusers});
      break;
    }
  }
  return out;
}

bool has_guidance_embedder(const SafetensorsHeader& header, const ComponentInFile& t) {
  if (t.layout == KeyLayout::OriginalFlux) return any_key_starts_with(header, t.prefix + "guidance_in.");
  return any_key_starts_with(header, t.prefix + "time_text_embed.guidance_embedder.");
}

TensorStore open_component(std::shared_ptr<const WeightFile> file, const ComponentInFile& found,
                           const LayoutConfigs& configs, const std::string& label) {
  const SafetensorsHeader& header = file->header();
  const std::vector<std::string> keys = component_keys(header, found);
  for (const auto& k : keys)
    if (is_scaled_fp8_marker(k))
      throw WeightError(str_cat(label, ": '", found.prefix, k,
                                "' marks a scaled-fp8 checkpoint (weights with per-tensor scales), which fluxmpi does not "
                                "load; use a plain fp8, fp16 or bf16 file"));
  std::vector<PresentedTensor> tensors;
  switch (found.layout) {
    case KeyLayout::OriginalFlux:
      tensors = configs.flux2 != nullptr ? map_original_flux2_transformer(header, found, keys, configs, label)
                                         : map_original_transformer(header, found, keys, configs, label);
      break;
    case KeyLayout::Ldm: tensors = map_ldm_vae(header, found, keys, configs, label); break;
    case KeyLayout::Diffusers:
      for (const auto& k : keys) tensors.push_back(PresentedTensor{k, {{found.prefix + k, 0, -1}}, {}});
      break;
  }
  return TensorStore::open_presented(std::move(file), label, tensors);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> flux_diffusers_shapes(const TransformerConfig& c) {
  const int64_t D = c.inner_dim(), H = c.attention_head_dim, M = 4 * D;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  auto linear = [&](const std::string& name, int64_t out_features, int64_t in_features) {
    out.push_back({name + ".weight", {out_features, in_features}});
    out.push_back({name + ".bias", {out_features}});
  };
  auto norm = [&](const std::string& name) { out.push_back({name + ".weight", {H}}); };
  linear("x_embedder", D, c.in_channels);
  linear("context_embedder", D, c.joint_attention_dim);
  linear("time_text_embed.timestep_embedder.linear_1", D, 256);
  linear("time_text_embed.timestep_embedder.linear_2", D, D);
  linear("time_text_embed.text_embedder.linear_1", D, c.pooled_projection_dim);
  linear("time_text_embed.text_embedder.linear_2", D, D);
  if (c.guidance_embeds) {
    linear("time_text_embed.guidance_embedder.linear_1", D, 256);
    linear("time_text_embed.guidance_embedder.linear_2", D, D);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    linear(b + "norm1.linear", 6 * D, D);
    linear(b + "norm1_context.linear", 6 * D, D);
    for (const char* p : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"})
      linear(b + "attn." + p, D, D);
    for (const char* p : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"}) norm(b + "attn." + p);
    linear(b + "ff.net.0.proj", M, D);
    linear(b + "ff.net.2", D, M);
    linear(b + "ff_context.net.0.proj", M, D);
    linear(b + "ff_context.net.2", D, M);
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".";
    linear(b + "norm.linear", 3 * D, D);
    for (const char* p : {"to_q", "to_k", "to_v"}) linear(b + "attn." + p, D, D);
    norm(b + "attn.norm_q");
    norm(b + "attn.norm_k");
    linear(b + "proj_mlp", M, D);
    linear(b + "proj_out", D, D + M);
  }
  linear("norm_out.linear", 2 * D, D);
  linear("proj_out", c.patch_size * c.patch_size * c.out_channels, D);
  return out;
}

void check_transformer_shapes(const TensorStore& store, const TransformerConfig& config) {
  std::set<std::string> expected;
  for (const auto& [key, shape] : flux_diffusers_shapes(config)) {
    expected.insert(key);
    if (!store.contains(key))
      throw WeightError(str_cat(store.label(), ": tensor '", key, "' not found (expected shape ", shape_text(shape), ")"));
    const std::vector<int64_t>& got = store.get(key).entry->shape;  // header only
    if (got != shape) {
      const std::string where = store.stored_as(key);
      throw WeightError(str_cat(store.label(), ": tensor '", key, "'", where.empty() ? "" : " (stored as " + where + ")",
                                " has shape ", shape_text(got), ", expected ", shape_text(shape)));
    }
  }
  for (const auto& key : store.keys())
    if (!expected.count(key))
      throw WeightError(str_cat(store.label(), ": unexpected tensor '", key, "': not a tensor of the configured transformer"));
}

}  // namespace fluxmpi::io
