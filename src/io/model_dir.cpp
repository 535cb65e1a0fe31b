#include "io/model_dir.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include "core/error.h"
#include "io/gguf.h"

namespace fluxmpi::io {
namespace fs = std::filesystem;

const char* variant_name(Variant v) { return v == Variant::Dev ? "dev" : "schnell"; }

namespace {

// model_index.json's _class_name: the FLUX.1 pipelines of diffusers whose folders fluxmpi reads
// (pipeline/image_mode.h tells what each one does), and the two FLUX.2 pipelines.
std::string checked_pipeline_class(const ConfigReader& index) {
  static const char* const kClasses[] = {"FluxPipeline",        "FluxImg2ImgPipeline", "FluxInpaintPipeline",
                                         "FluxFillPipeline",    "FluxControlPipeline", "FluxKontextPipeline",
                                         "Flux2Pipeline",       "Flux2KleinPipeline"};
  std::string cls = index.string("_class_name", "FluxPipeline");
  for (const char* known : kClasses)
    if (cls == known) return cls;
  index.fail("_class_name", str_cat("must be one of FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, "
                                    "FluxFillPipeline, FluxControlPipeline, FluxKontextPipeline, Flux2Pipeline, "
                                    "Flux2KleinPipeline; got \"", cls, "\""));
  return cls;
}

void check_pipeline_folder(const std::string& root, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(root, ec)) throw ConfigError(str_cat(what, " '", root, "': not found"));
  if (!fs::is_directory(root, ec)) throw ConfigError(str_cat(what, " '", root, "': not a directory"));
  if (!fs::exists(fs::path(root) / "model_index.json", ec))
    throw ConfigError(str_cat(what, " '", root, "': model_index.json not found (not a diffusers pipeline folder)"));
}

std::string absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

Component component_from_name(const std::string& name) {
  for (Component c : kComponents)
    if (name == component_name(c)) return c;
  throw InternalError(str_cat("unknown model component '", name, "'"));
}

std::string found_list(const std::vector<ComponentInFile>& found) {
  std::string s;
  for (const auto& f : found) s += str_cat(s.empty() ? "" : ", ", component_name(f.component), " (", describe_layout(f), ")");
  return s;
}

// What a file holds, or a WeightError when it holds no FLUX component at all.
std::vector<ComponentInFile> components_of(const WeightFile& file, const std::string& option) {
  std::vector<ComponentInFile> found = detect_components(file.header());
  if (found.empty()) {
    const auto& t = file.header().tensors;
    throw WeightError(str_cat(option, " '", file.path(), "': no FLUX component found: its keys",
                              t.empty() ? std::string(" (none)") : str_cat(" (e.g. '", t.front().name, "')"),
                              " are neither diffusers/transformers keys nor the original FLUX, LDM VAE or ComfyUI "
                              "layouts"));
  }
  return found;
}

}  // namespace

const std::string& ModelSources::override_of(Component c) const {
  switch (c) {
    case Component::Transformer: return transformer;
    case Component::Vae: return vae;
    case Component::TextEncoder: return text_encoder;
    case Component::TextEncoder2: return text_encoder_2;
  }
  return transformer;
}

bool ModelSources::only_a_folder() const {
  return transformer.empty() && vae.empty() && text_encoder.empty() && text_encoder_2.empty() && model_config.empty();
}

std::string ComponentSource::describe() const {
  if (path.empty()) return str_cat("none (", missing, ")");
  if (single_file && gguf) return str_cat(path, " (GGUF, ", describe_layout(found), "; ", quantization, ")");
  if (single_file) return str_cat(path, " (", describe_layout(found), ")");
  return str_cat(path, " (diffusers folder)");
}

ModelDir::ModelDir(const std::string& root) : root_(root) {
  check_pipeline_folder(root, "model dir");
  ConfigReader index = read_config("model_index.json");
  pipeline_class_ = checked_pipeline_class(index);
  if (family() == ModelFamily::Flux2) flux2_kind_ = parse_flux2_kind(index);
  sources_.model = root;
  for (Component c : kComponents) components_[static_cast<int>(c)].path = (fs::path(root) / component_name(c)).string();
}

ModelDir::ModelDir(const ModelSources& given) {
  ModelSources s = given;
  for (std::string* p : {&s.model, &s.transformer, &s.vae, &s.text_encoder, &s.text_encoder_2, &s.model_config,
                         &s.shipped_models})
    *p = absolute(*p);
  std::error_code ec;
  const bool model_is_folder = !s.model.empty() && fs::is_directory(s.model, ec);
  std::map<std::string, std::shared_ptr<WeightFile>> files;  // each file's header read once
  auto file = [&](const std::string& path) -> const WeightFile& {
    auto& f = files[path];
    if (!f) f = open_weight_file(path);
    return *f;
  };

  // Each component: its override, else --model (a pipeline folder's component folder, or the file).
  for (Component c : kComponents) {
    ComponentSource& src = components_[static_cast<int>(c)];
    const std::string& o = s.override_of(c);
    const std::string path = o.empty() ? s.model : o;
    const std::string option = o.empty() ? "--model" : component_option(c);
    if (path.empty()) {
      src.missing = str_cat("no ", component_name(c), ": give --model or ", component_option(c));
      continue;
    }
    if (fs::is_directory(path, ec)) {
      // A pipeline folder given for one component stands for its component folder.
      const fs::path sub = fs::path(path) / component_name(c);
      const bool pipeline = fs::exists(fs::path(path) / "model_index.json", ec) && fs::is_directory(sub, ec);
      src.path = (o.empty() || pipeline) ? sub.string() : path;
      continue;
    }
    if (!fs::exists(path, ec)) throw ConfigError(str_cat(option, " '", path, "': not found"));
    const std::vector<ComponentInFile> found = components_of(file(path), option);
    auto it = std::find_if(found.begin(), found.end(), [&](const ComponentInFile& f) { return f.component == c; });
    if (it != found.end()) {
      src.path = path;
      src.single_file = true;
      src.found = *it;
      if (const auto* g = dynamic_cast<const GgufFile*>(&file(path))) {
        src.gguf = true;
        src.quantization = describe_dtypes(g->header());
      }
    } else if (!o.empty() || c == Component::Transformer) {
      throw WeightError(str_cat(option, " '", path, "': holds no ", component_name(c), " (it holds ", found_list(found), ")"));
    } else {
      src.missing = str_cat("--model '", path, "' holds no ", component_name(c), " (it holds ", found_list(found),
                            "): give ", component_option(c), " FILE|DIR");
    }
  }

  // The configs: --model-config, else the --model folder, else the shipped model of the variant.
  if (!s.model_config.empty()) {
    root_ = s.model_config;
    check_pipeline_folder(root_, "--model-config");
  } else if (model_is_folder) {
    root_ = s.model;
    check_pipeline_folder(root_, "model dir");
  } else {
    const ComponentSource& t = components_[static_cast<int>(Component::Transformer)];
    bool guidance = false;
    if (t.single_file) {
      guidance = has_guidance_embedder(file(t.path).header(), t.found);
    } else if (!t.path.empty()) {
      guidance = TensorStore::open_dir(t.path, str_cat("--transformer '", t.path, "'"))
                     .contains("time_text_embed.guidance_embedder.linear_1.weight");
    } else {
      throw UsageError(t.missing);
    }
    root_ = (fs::path(s.shipped_models) / (guidance ? "FLUX.1-dev" : "FLUX.1-schnell")).string();
    if (!fs::exists(fs::path(root_) / "model_index.json", ec))
      throw ConfigError(str_cat("no --model-config given and the shipped ", guidance ? "FLUX.1-dev" : "FLUX.1-schnell",
                                " configs are missing: '", root_, "' has no model_index.json (pass --model-config DIR)"));
    s.model_config = root_;
  }
  ConfigReader index = read_config("model_index.json");
  pipeline_class_ = checked_pipeline_class(index);
  if (family() == ModelFamily::Flux2) flux2_kind_ = parse_flux2_kind(index);
  sources_ = s;
}

ModelFamily ModelDir::family() const {
  return pipeline_class_.rfind("Flux2", 0) == 0 ? ModelFamily::Flux2 : ModelFamily::Flux1;
}

const Flux2TransformerConfig& ModelDir::flux2_transformer_config() const {
  if (!flux2_transformer_) flux2_transformer_ = parse_flux2_transformer_config(read_config("transformer/config.json"));
  return *flux2_transformer_;
}

const ComponentSource& ModelDir::source(Component c) const { return components_[static_cast<int>(c)]; }

void ModelDir::require(Component c) const {
  const ComponentSource& src = source(c);
  if (src.path.empty()) throw UsageError(src.missing);
}

std::string ModelDir::describe_sources() const {
  std::string out = str_cat("model config:   ", root_, "\n");
  for (Component c : kComponents) {
    std::string name = component_name(c);
    name += ":";
    name.resize(16, ' ');
    out += name + source(c).describe() + "\n";
  }
  return out;
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
  if (v.latent_channels * 4 != t.out_channels)
    throw ConfigError(str_cat(label("vae/config.json"), ": 'latent_channels' (", v.latent_channels,
                              ") times 4 must equal transformer/config.json 'out_channels' (", t.out_channels, ")"));
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
  // A single file has no config of its own: every tensor is compared with the shape the config
  // gives it, reported as the tensor's error rather than the config key's.
  if (source(Component::Transformer).single_file) check_transformer_shapes(store, c);
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
  const Component c = component_from_name(component);
  const ComponentSource& src = source(c);
  if (src.path.empty()) throw UsageError(src.missing);
  if (!src.single_file) {
    // The folder of old keeps its labels ("model dir '/m': transformer").
    if (src.path == (fs::path(root_) / component).string()) return TensorStore::open_dir(component_dir(component), label(component));
    return TensorStore::open_dir(src.path, str_cat(component, " folder '", src.path, "'"));
  }
  LayoutConfigs configs;
  if (src.found.layout == KeyLayout::OriginalFlux) {
    if (family() == ModelFamily::Flux2) configs.flux2 = &flux2_transformer_config();
    else configs.transformer = &transformer_config();
    configs.transformer_label = label("transformer/config.json");
  }
  if (src.found.layout == KeyLayout::Ldm) {
    configs.vae = &vae_config();
    configs.vae_label = label("vae/config.json");
  }
  return open_component(open_weight_file(src.path), src.found, configs,
                        str_cat(component, " file '", src.path, "'"));
}

}  // namespace fluxmpi::io
