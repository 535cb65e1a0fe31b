#include "io/model_dir.h"

#include <filesystem>
#include <regex>
#include <set>

#include "core/error.h"

namespace fluxmpi::io {
namespace fs = std::filesystem;

const char* variant_name(Variant v) { return v == Variant::Dev ? "dev" : "schnell"; }

ModelDir::ModelDir(const std::string& root) : root_(root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) throw ConfigError(str_cat("model dir '", root, "': not found"));
  if (!fs::is_directory(root, ec)) throw ConfigError(str_cat("model dir '", root, "': not a directory"));
  if (!fs::exists(fs::path(root) / "model_index.json", ec))
    throw ConfigError(str_cat("model dir '", root, "': model_index.json not found (not a diffusers pipeline folder)"));
  ConfigReader index = read_config("model_index.json");
  std::string cls = index.string("_class_name", "FluxPipeline");
  if (cls != "FluxPipeline")
    index.fail("_class_name", str_cat("must be \"FluxPipeline\", got \"", cls, "\""));
}

std::string ModelDir::path(const std::string& relative) const { return (fs::path(root_) / relative).string(); }

std::string ModelDir::label(const std::string& relative) const {
  return str_cat("model dir '", root_, "': ", relative);
}

std::string ModelDir::component_dir(const std::string& component) const {
  std::error_code ec;
  fs::path p = fs::path(root_) / component;
  if (!fs::is_directory(p, ec)) throw ConfigError(str_cat(label(component), ": component directory not found"));
  return p.string();
}

ConfigReader ModelDir::read_config(const std::string& relative) const {
  return ConfigReader::from_file(path(relative), label(relative));
}

const TransformerConfig& ModelDir::transformer_config() const {
  if (!transformer_) transformer_ = parse_transformer_config(read_config("transformer/config.json"));
  return *transformer_;
}

const SchedulerConfig& ModelDir::scheduler_config() const {
  if (!scheduler_) scheduler_ = parse_scheduler_config(read_config("scheduler/scheduler_config.json"));
  return *scheduler_;
}

const VaeConfig& ModelDir::vae_config() const {
  if (!vae_) vae_ = parse_vae_config(read_config("vae/config.json"));
  return *vae_;
}

const ClipTextConfig& ModelDir::clip_config() const {
  if (!clip_) clip_ = parse_clip_text_config(read_config("text_encoder/config.json"));
  return *clip_;
}

const T5Config& ModelDir::t5_config() const {
  if (!t5_) t5_ = parse_t5_config(read_config("text_encoder_2/config.json"));
  return *t5_;
}

void ModelDir::check_consistency(bool with_text) const {
  const TransformerConfig& t = transformer_config();
  scheduler_config();
  const VaeConfig& v = vae_config();
  if (v.latent_channels * 4 != t.in_channels)
    throw ConfigError(str_cat(label("vae/config.json"), ": 'latent_channels' (", v.latent_channels,
                              ") times 4 must equal transformer/config.json 'in_channels' (", t.in_channels, ")"));
  if (!with_text) return;
  const T5Config& t5 = t5_config();
  if (t5.d_model != t.joint_attention_dim)
    throw ConfigError(str_cat(label("text_encoder_2/config.json"), ": 'd_model' (", t5.d_model,
                              ") must equal transformer/config.json 'joint_attention_dim' (", t.joint_attention_dim, ")"));
  const ClipTextConfig& clip = clip_config();
  if (clip.hidden_size != t.pooled_projection_dim)
    throw ConfigError(str_cat(label("text_encoder/config.json"), ": 'hidden_size' (", clip.hidden_size,
                              ") must equal transformer/config.json 'pooled_projection_dim' (", t.pooled_projection_dim, ")"));
}

void ModelDir::check_transformer_weights(const TensorStore& store) const {
  const TransformerConfig& c = transformer_config();
  const std::string cfg = label("transformer/config.json");
  // Block counts: the highest index present in the weights must match the config.
  static const std::regex block_re(R"(^(transformer_blocks|single_transformer_blocks)\.(\d+)\.)");
  int64_t max_double = -1, max_single = -1;
  for (const auto& key : store.keys()) {
    std::smatch m;
    if (std::regex_search(key, m, block_re)) {
      int64_t i = std::stoll(m[2].str());
      if (m[1].str() == "transformer_blocks") max_double = std::max(max_double, i);
      else max_single = std::max(max_single, i);
    }
  }
  if (max_double + 1 != c.num_layers)
    throw ConfigError(str_cat(cfg, ": 'num_layers' is ", c.num_layers, " but the weights hold ", max_double + 1,
                              " transformer_blocks"));
  if (max_single + 1 != c.num_single_layers)
    throw ConfigError(str_cat(cfg, ": 'num_single_layers' is ", c.num_single_layers, " but the weights hold ",
                              max_single + 1, " single_transformer_blocks"));
  auto shape_of = [&](const std::string& key) -> std::vector<int64_t> {
    if (!store.contains(key)) return {};
    // Header-only: maps the shard but reads no tensor data.
    return store.get(key).entry->shape;
  };
  auto expect = [&](const std::string& key, std::vector<int64_t> want, const char* config_keys) {
    auto got = shape_of(key);
    if (got.empty()) return;  // absent keys are reported by the loader
    if (got != want) {
      std::string g, w;
      for (auto x : got) g += (g.empty() ? "" : ", ") + std::to_string(x);
      for (auto x : want) w += (w.empty() ? "" : ", ") + std::to_string(x);
      throw ConfigError(str_cat(cfg, ": ", config_keys, " give ", key, " the shape [", w, "] but the weights have [", g, "]"));
    }
  };
  const int64_t D = c.inner_dim();
  expect("x_embedder.weight", {D, c.in_channels}, "'num_attention_heads' x 'attention_head_dim' and 'in_channels'");
  expect("context_embedder.weight", {D, c.joint_attention_dim}, "'joint_attention_dim'");
  expect("time_text_embed.text_embedder.linear_1.weight", {D, c.pooled_projection_dim}, "'pooled_projection_dim'");
  expect("proj_out.weight", {c.out_channels, D}, "'out_channels'");
  if (c.num_layers > 0)
    expect("transformer_blocks.0.attn.norm_q.weight", {c.attention_head_dim}, "'attention_head_dim'");
  bool has_guidance = store.contains("time_text_embed.guidance_embedder.linear_1.weight");
  if (has_guidance != c.guidance_embeds)
    throw ConfigError(str_cat(cfg, ": 'guidance_embeds' is ", c.guidance_embeds ? "true" : "false", " but the weights ",
                              has_guidance ? "have" : "have no", " time_text_embed.guidance_embedder"));
}

TensorStore ModelDir::open_weights(const std::string& component) const {
  return TensorStore::open_dir(component_dir(component), label(component));
}

}  // namespace fluxmpi::io
