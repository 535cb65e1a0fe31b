#include "io/redux_dir.h"

#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::io {
namespace fs = std::filesystem;

namespace {

// Sides beyond any SigLIP checkpoint (384 px for Redux): keeps the patch counts far from overflow.
constexpr int64_t kMaxSide = 65536;

// A number or a list of `count` numbers (transformers accepts both for image_mean / image_std).
std::vector<double> number_or_list(const ConfigReader& r, const std::string& key, const std::vector<double>& fallback,
                                   size_t count) {
  if (!r.has(key)) return fallback;
  const nlohmann::json& v = r.json().at(key);
  if (v.is_number()) return std::vector<double>(count, r.number(key, 0.0));
  if (!v.is_array() || v.size() != count)
    r.fail(key, str_cat("must be a number or a list of ", count, " numbers (one per channel), got ", v.dump()));
  std::vector<double> out;
  for (const auto& x : v) {
    if (!x.is_number()) r.fail(key, str_cat("must be a list of numbers, got ", v.dump()));
    out.push_back(x.get<double>());
  }
  return out;
}

// A sub-object of a config as a reader of its own, labelled "<file>: '<key>'".
ConfigReader sub_reader(const ConfigReader& r, const std::string& key) {
  const nlohmann::json& v = r.json().at(key);
  if (!v.is_object()) r.fail(key, str_cat("must be an object, got ", v.dump()));
  return ConfigReader::from_text(v.dump(), str_cat(r.label(), ": '", key, "'"));
}

}  // namespace

SiglipVisionConfig parse_siglip_vision_config(const ConfigReader& reader) {
  // SiglipConfig (text + vision) keeps the vision tower's fields under vision_config.
  std::optional<ConfigReader> nested;
  if (reader.string("model_type", "") == "siglip" && reader.has("vision_config")) nested.emplace(sub_reader(reader, "vision_config"));
  const ConfigReader& r = nested ? *nested : reader;
  const std::string type = r.string("model_type", "siglip_vision_model");
  if (type != "siglip_vision_model")
    r.fail("model_type", str_cat("must be \"siglip_vision_model\" (a SigLIP vision tower), got \"", type, "\""));
  SiglipVisionConfig c;
  c.hidden_size = r.positive("hidden_size", c.hidden_size);
  c.intermediate_size = r.positive("intermediate_size", c.intermediate_size);
  c.num_hidden_layers = r.integer("num_hidden_layers", c.num_hidden_layers, 0);
  c.num_attention_heads = r.positive("num_attention_heads", c.num_attention_heads);
  c.num_channels = r.positive("num_channels", c.num_channels);
  c.image_size = r.positive("image_size", c.image_size);
  c.patch_size = r.positive("patch_size", c.patch_size);
  c.hidden_act = r.string("hidden_act", c.hidden_act);
  c.layer_norm_eps = r.positive_number("layer_norm_eps", c.layer_norm_eps);
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("hidden_size", str_cat("(", c.hidden_size, ") must be divisible by num_attention_heads (", c.num_attention_heads, ")"));
  if (c.image_size > kMaxSide) r.fail("image_size", str_cat("must be at most ", kMaxSide, ", got ", c.image_size));
  if (c.patch_size > c.image_size)
    r.fail("patch_size", str_cat("(", c.patch_size, ") is larger than image_size (", c.image_size, ")"));
  if (c.num_channels != 3)
    r.fail("num_channels", str_cat("must be 3 (RGB images), got ", c.num_channels));
  return c;
}

int64_t SiglipVisionConfig::parameters() const {
  const int64_t D = hidden_size, F = intermediate_size, p = patch_size;
  const int64_t embeddings = D * num_channels * p * p + D + num_positions() * D;
  const int64_t layer = 4 * (D * D + D) + 2 * D * F + F + D + 2 * 2 * D;  // attention, MLP, two LayerNorms
  return embeddings + num_hidden_layers * layer + 2 * D;                  // + post_layernorm
}

int64_t ReduxEmbedderConfig::parameters() const {
  const int64_t up = 3 * txt_in_features;
  return redux_dim * up + up + up * txt_in_features + txt_in_features;
}

SiglipProcessorConfig parse_siglip_processor_config(const ConfigReader& r) {
  SiglipProcessorConfig c;
  if (r.has("size")) {
    const ConfigReader size = sub_reader(r, "size");
    if (!size.has("height") || !size.has("width"))
      r.fail("size", str_cat("must give \"height\" and \"width\" (SiglipImageProcessor resizes to a fixed size), got ",
                             r.json().at("size").dump()));
    c.height = size.positive("height", c.height);
    c.width = size.positive("width", c.width);
    if (c.height > kMaxSide || c.width > kMaxSide)
      r.fail("size", str_cat("must be at most ", kMaxSide, " pixels a side, got ", c.height, "x", c.width));
  }
  const int64_t resample = r.integer("resample", static_cast<int64_t>(c.resample), 0);
  if (resample != static_cast<int64_t>(Resample::Bicubic) && resample != static_cast<int64_t>(Resample::Lanczos))
    r.fail("resample", str_cat("must be 3 (BICUBIC) or 1 (LANCZOS), the Pillow filters fluxmpi reproduces; got ",
                               resample));
  c.resample = static_cast<Resample>(resample);
  c.do_rescale = r.boolean("do_rescale", c.do_rescale);
  c.rescale_factor = r.number("rescale_factor", c.rescale_factor);
  c.do_normalize = r.boolean("do_normalize", c.do_normalize);
  c.image_mean = number_or_list(r, "image_mean", c.image_mean, 3);
  c.image_std = number_or_list(r, "image_std", c.image_std, 3);
  for (double s : c.image_std)
    if (c.do_normalize && s == 0.0) r.fail("image_std", "must not contain 0 (normalisation divides by it)");
  return c;
}

ReduxEmbedderConfig parse_redux_embedder_config(const ConfigReader& r) {
  const std::string cls = r.string("_class_name", "ReduxImageEncoder");
  if (cls != "ReduxImageEncoder") r.fail("_class_name", str_cat("must be \"ReduxImageEncoder\", got \"", cls, "\""));
  ReduxEmbedderConfig c;
  c.redux_dim = r.positive("redux_dim", c.redux_dim);
  c.txt_in_features = r.positive("txt_in_features", c.txt_in_features);
  return c;
}

ReduxDir::ReduxDir(const std::string& root) : root_(root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) throw ConfigError(str_cat("redux dir '", root, "': not found"));
  if (!fs::is_directory(root, ec)) throw ConfigError(str_cat("redux dir '", root, "': not a directory"));
  const std::string index_path = (fs::path(root) / "model_index.json").string();
  if (!fs::exists(index_path, ec))
    throw ConfigError(str_cat("redux dir '", root, "': model_index.json not found (not a diffusers pipeline folder)"));
  const ConfigReader index = ConfigReader::from_file(index_path, label("model_index.json"));
  const std::string cls = index.string("_class_name", "");
  if (cls != kReduxPipelineClass)
    index.fail("_class_name", str_cat("must be \"", kReduxPipelineClass, "\" (a FLUX.1 Redux folder such as "
                                      "FLUX.1-Redux-dev), got \"", cls, "\""));
  auto read = [&](const std::string& relative) {
    return ConfigReader::from_file((fs::path(root) / relative).string(), label(relative));
  };
  const ConfigReader enc = read("image_encoder/config.json");
  encoder_ = parse_siglip_vision_config(enc);
  const ConfigReader proc = read("feature_extractor/preprocessor_config.json");
  processor_ = parse_siglip_processor_config(proc);
  const ConfigReader emb = read("image_embedder/config.json");
  embedder_ = parse_redux_embedder_config(emb);

  if (embedder_.redux_dim != encoder_.hidden_size)
    emb.fail("redux_dim", str_cat("(", embedder_.redux_dim, ") must equal the image encoder's hidden_size (",
                                  encoder_.hidden_size, ", image_encoder/config.json)"));
  // transformers adds the position table to the patch embeddings without interpolation: the
  // processor's output must cut into exactly as many patches as the table has rows.
  const int64_t patches = (processor_.height / encoder_.patch_size) * (processor_.width / encoder_.patch_size);
  if (patches != encoder_.num_positions())
    proc.fail("size", str_cat(processor_.height, "x", processor_.width, " gives ", patches, " patches of ",
                              encoder_.patch_size, " pixels, but the image encoder has ", encoder_.num_positions(),
                              " positions (image_size ", encoder_.image_size, ", image_encoder/config.json)"));
}

std::string ReduxDir::label(const std::string& relative) const { return str_cat("redux dir '", root_, "': ", relative); }

int64_t ReduxDir::image_tokens() const { return encoder_.num_positions(); }

TensorStore ReduxDir::open_weights(const std::string& component) const {
  FLUX_CHECK(component == "image_encoder" || component == "image_embedder", component);
  std::error_code ec;
  const fs::path dir = fs::path(root_) / component;
  if (!fs::is_directory(dir, ec)) throw ConfigError(str_cat(label(component), ": component directory not found"));
  return TensorStore::open_dir(dir.string(), label(component));
}

}  // namespace fluxmpi::io
