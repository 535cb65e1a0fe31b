#include "ckpt/format.h"

#include <charconv>
#include <ctime>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "io/flux2_configs.h"
#include "io/json_config.h"

namespace fluxmpi::ckpt {
namespace {

// Shortest text that reads back as the same double, so a message never shows two equal-looking
// values as different.
std::string number_text(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}
std::string value_text(int64_t v) { return std::to_string(v); }
std::string value_text(double v) { return number_text(v); }
std::string value_text(bool v) { return v ? "true" : "false"; }
std::string value_text(const std::string& v) { return str_cat("\"", v, "\""); }
std::string value_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Collects the first difference between the checkpoint and the request, in a fixed field order.
class FirstDifference {
 public:
  template <typename T>
  void field(const std::string& where, const char* name, const T& stored, const T& requested) {
    if (found_ || stored == requested) return;
    found_ = str_cat(where, "'", name, "' is ", value_text(stored), " in the checkpoint, the command line asks for ",
                     value_text(requested));
  }
  const std::optional<std::string>& found() const { return found_; }

 private:
  std::optional<std::string> found_;
};

}  // namespace

const char* status_name(ImageStatus status) {
  switch (status) {
    case ImageStatus::Encoding: return "encoding";
    case ImageStatus::Denoising: return "denoising";
    case ImageStatus::Decoded: return "decoded";
  }
  return "?";
}

ImageStatus parse_status(const std::string& text, const std::string& where) {
  for (ImageStatus s : {ImageStatus::Encoding, ImageStatus::Denoising, ImageStatus::Decoded})
    if (text == status_name(s)) return s;
  throw CheckpointError(str_cat(where, ": status is '", text, "', expected encoding, denoising or decoded"));
}

bool uses_true_cfg(const ImageAttributes& a) { return a.true_cfg_scale > 1.0; }

io::TransformerConfig stored_transformer_config(const std::string& model_config, const std::string& label) {
  try {
    const io::ConfigReader reader = io::ConfigReader::from_text(model_config, label);
    // A FLUX.2 checkpoint stores Flux2Transformer2DModel's config: its shape fields are the same.
    if (io::is_flux2_transformer_config(reader)) return io::transformer_shape(io::parse_flux2_transformer_config(reader));
    return io::parse_transformer_config(reader);
  } catch (const ConfigError& e) {
    throw CheckpointError(e.what());
  }
}

ImageShape image_shape(const io::TransformerConfig& config, const FileAttributes& file, const ImageAttributes& image,
                       const std::string& where) {
  const int64_t f = file.vae_scale_factor;
  if (f <= 0 || (f & (f - 1)) != 0)
    throw CheckpointError(str_cat(where, ": attribute 'vae_scale_factor' must be a power of two, got ", f));
  for (auto [name, v] : {std::pair<const char*, int64_t>{"height", image.height}, {"width", image.width}})
    if (v <= 0 || v % (2 * f) != 0)
      throw CheckpointError(str_cat(where, ": attribute '", name, "' must be a positive multiple of ", 2 * f,
                                    " (2 * vae_scale_factor), got ", v));
  if (image.num_inference_steps <= 0)
    throw CheckpointError(str_cat(where, ": attribute 'num_inference_steps' must be positive, got ",
                                  image.num_inference_steps));
  if (image.max_sequence_length <= 0)
    throw CheckpointError(str_cat(where, ": attribute 'max_sequence_length' must be positive, got ",
                                  image.max_sequence_length));
  for (auto [name, v] : {std::pair<const char*, int64_t>{"patches", image.patches}, {"warmup_steps", image.warmup_steps}})
    if (v < 1) throw CheckpointError(str_cat(where, ": attribute '", name, "' must be positive, got ", v));
  ImageShape s;
  s.text_tokens = image.max_sequence_length;
  s.prompt_tokens = image.max_sequence_length;
  if (image.redux.enabled()) {
    const auto& r = image.redux;
    if (image.family != "flux1" || uses_true_cfg(image))
      throw CheckpointError(str_cat(where, ": attribute 'redux': Redux images are FLUX.1 images without true CFG"));
    if (r.images.empty() || r.prompt_scales.size() != r.images.size() || r.pooled_scales.size() != r.images.size() ||
        r.image_tokens <= 0)
      throw CheckpointError(str_cat(where, ": attribute 'redux' needs at least one image, one scale of each kind per "
                                           "image and a positive image_tokens"));
    s.text_tokens += r.image_tokens;
    s.token_ids = !r.zero_text;
    s.redux_images = static_cast<int64_t>(r.images.size());
    s.redux_tokens = r.image_tokens;
    for (const auto& in : r.images) {
      if (in.height <= 0 || in.width <= 0)
        throw CheckpointError(str_cat(where, ": attribute 'redux': image '", in.path, "' has no size"));
      s.redux_hw.emplace_back(in.height, in.width);
    }
  }
  s.joint_attention_dim = config.joint_attention_dim;
  s.pooled_projection_dim = config.pooled_projection_dim;
  s.latent_height = image.height / f;
  s.latent_width = image.width / f;
  s.latent_channels = config.latent_channels();
  s.image_tokens = (s.latent_height / 2) * (s.latent_width / 2);
  s.token_dim = config.out_channels;
  if (image.t_start < 0 || image.t_start >= image.num_inference_steps)
    throw CheckpointError(str_cat(where, ": attribute 't_start' must be in [0, num_inference_steps), got ", image.t_start));
  s.steps = image.num_inference_steps - image.t_start;
  s.height = image.height;
  s.width = image.width;
  s.true_cfg = uses_true_cfg(image);
  s.patched = image.patches > 1;
  s.pipeline = image.pipeline;
  if (image.family != "flux1" && image.family != "flux2")
    throw CheckpointError(str_cat(where, ": attribute 'family' is '", image.family, "', expected flux1 or flux2"));
  s.flux2 = image.family == "flux2";
  if (s.flux2 && image.pipeline != "text2img" && image.pipeline != "multiref")
    throw CheckpointError(str_cat(where, ": attribute 'pipeline' is '", image.pipeline,
                                  "': FLUX.2 images are text2img or multiref"));
  if (!s.flux2 && image.pipeline == "multiref")
    throw CheckpointError(str_cat(where, ": attribute 'pipeline' is 'multiref': only FLUX.2 images take reference images"));
  s.image_h = image.image.height, s.image_w = image.image.width;
  s.mask_h = image.mask.height, s.mask_w = image.mask.width;
  s.control_h = image.control_image.height, s.control_w = image.control_image.width;
  const std::string& p = image.pipeline;
  if (p != "text2img" && p != "img2img" && p != "inpaint" && p != "fill" && p != "control" && p != "kontext" &&
      p != "controlnet" && p != "multiref")
    throw CheckpointError(str_cat(where, ": attribute 'pipeline' is '", p,
                                  "', expected text2img, img2img, inpaint, fill, control, kontext, controlnet or multiref"));
  if ((p == "controlnet") != !image.controlnets.empty())
    throw CheckpointError(str_cat(where, ": attribute 'controlnets' lists ", image.controlnets.size(),
                                  " ControlNet runs for pipeline '", p, "'"));
  for (const ControlNetUse& run : image.controlnets) {
    if (run.height <= 0 || run.width <= 0)
      throw CheckpointError(str_cat(where, ": attribute 'controlnets': control image '", run.control_image, "' of size ",
                                    run.height, "x", run.width));
    s.controlnet_inputs.emplace_back(run.height, run.width);
    if (!run.pixels) ++s.controlnet_latents;
  }
  if ((p == "multiref") != !image.references.empty())
    throw CheckpointError(str_cat(where, ": attribute 'reference_images' is ", image.references.size(), " but 'pipeline' is '",
                                  p, "' (multiref images have reference images, the others none)"));
  for (size_t k = 0; k < image.references.size(); ++k) {
    const ImageAttributes::Reference& r = image.references[k];
    if (r.height <= 0 || r.width <= 0 || r.height % (2 * f) != 0 || r.width % (2 * f) != 0 || r.input.height <= 0 ||
        r.input.width <= 0)
      throw CheckpointError(str_cat(where, ": reference image ", k, " is encoded at ", r.width, "x", r.height, " from ",
                                    r.input.width, "x", r.input.height, " pixels (positive multiples of ", 2 * f, " expected)"));
    s.reference_inputs.emplace_back(r.input.height, r.input.width);
    s.condition_tokens += (r.height / (2 * f)) * (r.width / (2 * f));
  }
  if (p == "multiref") s.condition_dim = s.token_dim;
  if (p == "img2img" || p == "inpaint" || p == "control") s.condition_tokens = s.image_tokens, s.condition_dim = s.token_dim;
  if (p == "fill") s.condition_tokens = s.image_tokens, s.condition_dim = 5 * s.token_dim;
  if (p == "kontext" && image.condition_height > 0)
    s.condition_tokens = (image.condition_height / (2 * f)) * (image.condition_width / (2 * f)), s.condition_dim = s.token_dim;
  return s;
}

const char* stored_type_name(StoredType type) {
  switch (type) {
    case StoredType::Float32: return "float32";
    case StoredType::Int32: return "int32";
    case StoredType::Int64: return "int64";
    case StoredType::UInt8: return "uint8";
    case StoredType::String: return "string";
  }
  return "?";
}

std::vector<DatasetSpec> dataset_specs(const ImageShape& s) {
  using T = StoredType;
  std::vector<DatasetSpec> specs = {
      {"status", T::String, {}, false},
      {"last_step", T::Int64, {}, false},
      {"text/prompt_embeds", T::Float32, {s.text_tokens, s.joint_attention_dim}, false},
  };
  if (s.flux2) {
    // One decoder-only text encoder: its ids and attention mask, no pooled output.
    specs.push_back({"text/input_ids", T::Int32, {s.text_tokens}, false});
    specs.push_back({"text/attention_mask", T::Int32, {s.text_tokens}, false});
    if (s.true_cfg) {
      specs.push_back({"text/negative_input_ids", T::Int32, {s.text_tokens}, false});
      specs.push_back({"text/negative_attention_mask", T::Int32, {s.text_tokens}, false});
      specs.push_back({"text/negative_prompt_embeds", T::Float32, {s.text_tokens, s.joint_attention_dim}, false});
    }
  } else {
    specs.push_back({"text/pooled_prompt_embeds", T::Float32, {s.pooled_projection_dim}, false});
    if (s.token_ids) {
      specs.push_back({"text/clip_input_ids", T::Int32, {kClipTokens}, false});
      specs.push_back({"text/t5_input_ids", T::Int32, {s.prompt_tokens}, false});
    }
  }
  // Redux: each image's tokens from the embedder (before the scales), and the images as decoded.
  if (s.redux_images > 0)
    specs.push_back({"text/redux_image_embeds", T::Float32, {s.redux_images, s.redux_tokens, s.joint_attention_dim}, false});
  for (size_t k = 0; k < s.redux_hw.size(); ++k)
    specs.push_back({str_cat("inputs/redux_image_", k), T::UInt8, {s.redux_hw[k].first, s.redux_hw[k].second, 3}, false});
  if (s.true_cfg && !s.flux2) {
    specs.push_back({"text/negative_prompt_embeds", T::Float32, {s.text_tokens, s.joint_attention_dim}, false});
    specs.push_back({"text/negative_pooled_prompt_embeds", T::Float32, {s.pooled_projection_dim}, false});
  }
  specs.push_back({"schedule/timesteps", T::Float32, {s.steps}, false});
  specs.push_back({"schedule/sigmas", T::Float32, {s.steps + 1}, false});
  specs.push_back({"latents/initial", T::Float32, {s.image_tokens, s.token_dim}, false});
  specs.push_back({"latents/steps", T::Float32, {0, s.image_tokens, s.token_dim}, true});
  specs.push_back({"latents/noise_pred", T::Float32, {0, s.image_tokens, s.token_dim}, true});
  specs.push_back({"latents/step_index", T::Int32, {0}, true});
  // Patch pipelining: 1 where the step ran exact (warm-up), 0 where it ran pipelined or not yet.
  if (s.patched) specs.push_back({"latents/exact", T::UInt8, {s.steps}, false});
  specs.push_back({"image", T::UInt8, {s.height, s.width, 3}, false});
  // Image inputs: the files as decoded (the mask as grey), and what the step loop conditions on.
  if (s.image_h > 0) specs.push_back({"inputs/image", T::UInt8, {s.image_h, s.image_w, 3}, false});
  if (s.mask_h > 0) specs.push_back({"inputs/mask", T::UInt8, {s.mask_h, s.mask_w}, false});
  if (s.control_h > 0) specs.push_back({"inputs/control_image", T::UInt8, {s.control_h, s.control_w, 3}, false});
  for (size_t k = 0; k < s.reference_inputs.size(); ++k)
    specs.push_back({str_cat("inputs/image_", k), T::UInt8, {s.reference_inputs[k].first, s.reference_inputs[k].second, 3}, false});
  if (s.condition_tokens > 0) specs.push_back({"latents/image", T::Float32, {s.condition_tokens, s.condition_dim}, false});
  for (size_t k = 0; k < s.controlnet_inputs.size(); ++k)
    specs.push_back({str_cat("inputs/controlnet_image_", k), T::UInt8,
                     {s.controlnet_inputs[k].first, s.controlnet_inputs[k].second, 3}, false});
  if (s.controlnet_latents > 0)
    specs.push_back({"latents/controlnet", T::Float32, {s.controlnet_latents, s.image_tokens, s.token_dim}, false});
  if (!s.reference_inputs.empty()) specs.push_back({"latents/image_ids", T::Int32, {s.condition_tokens, 4}, false});
  if (s.pipeline == "inpaint") {
    specs.push_back({"latents/noise", T::Float32, {s.image_tokens, s.token_dim}, false});
    specs.push_back({"latents/mask", T::Float32, {s.image_tokens, s.token_dim}, false});
  }
  return specs;
}

std::string spec_text(const DatasetSpec& spec) {
  if (spec.shape.empty()) return str_cat(stored_type_name(spec.type), " scalar");
  std::string s = str_cat(stored_type_name(spec.type), " [");
  for (size_t i = 0; i < spec.shape.size(); ++i)
    s += str_cat(i ? ", " : "", (spec.extendable && i == 0) ? std::string("n") : std::to_string(spec.shape[i]));
  return s + "]";
}

std::string image_group(int64_t image) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "/images/%05lld", static_cast<long long>(image));
  return buf;
}

std::string image_object(int64_t image, const std::string& relative) { return image_group(image) + "/" + relative; }

void check_matches(const std::string& label, const FileAttributes& stored_file,
                   const std::vector<ImageAttributes>& stored_images, const FileAttributes& requested_file,
                   const std::vector<ImageAttributes>& requested_images) {
  FirstDifference d;
  d.field("", "format_version", stored_file.format_version, kFormatVersion);
  if (!d.found()) {
    io::TransformerConfig s = stored_transformer_config(stored_file.model_config, str_cat(label, ": /model_config"));
    io::TransformerConfig r;
    try {
      r = stored_transformer_config(requested_file.model_config, "transformer config");
    } catch (const CheckpointError& e) {
      throw InternalError(str_cat("check_matches: the requested transformer config is invalid: ", e.what()));
    }
    const std::string w = "model_config: ";
    d.field(w, "patch_size", s.patch_size, r.patch_size);
    d.field(w, "in_channels", s.in_channels, r.in_channels);
    d.field(w, "out_channels", s.out_channels, r.out_channels);
    d.field(w, "num_layers", s.num_layers, r.num_layers);
    d.field(w, "num_single_layers", s.num_single_layers, r.num_single_layers);
    d.field(w, "attention_head_dim", s.attention_head_dim, r.attention_head_dim);
    d.field(w, "num_attention_heads", s.num_attention_heads, r.num_attention_heads);
    d.field(w, "joint_attention_dim", s.joint_attention_dim, r.joint_attention_dim);
    d.field(w, "pooled_projection_dim", s.pooled_projection_dim, r.pooled_projection_dim);
    d.field(w, "guidance_embeds", s.guidance_embeds, r.guidance_embeds);
    d.field(w, "axes_dims_rope", s.axes_dims_rope, r.axes_dims_rope);
  }
  d.field("", "vae_scale_factor", stored_file.vae_scale_factor, requested_file.vae_scale_factor);
  // The weights themselves: a recorded source the run also names must be the same file. (A
  // resumed run that encodes nothing names no text encoders.)
  {
    const auto& s = stored_file.sources;
    const auto& r = requested_file.sources;
    const std::pair<const char*, std::pair<const std::string*, const std::string*>> sources[] = {
        {"source_transformer", {&s.transformer, &r.transformer}},
        {"source_vae", {&s.vae, &r.vae}},
        {"source_text_encoder", {&s.text_encoder, &r.text_encoder}},
        {"source_text_encoder_2", {&s.text_encoder_2, &r.text_encoder_2}},
        {"source_model_config", {&s.model_config, &r.model_config}},
        {"source_transformer_quantization", {&s.transformer_quantization, &r.transformer_quantization}}};
    for (const auto& [name, pair] : sources)
      if (!pair.first->empty() && !pair.second->empty()) d.field("", name, *pair.first, *pair.second);
  }
  d.field("", "number of images", static_cast<int64_t>(stored_images.size()),
          static_cast<int64_t>(requested_images.size()));
  for (size_t i = 0; i < stored_images.size() && i < requested_images.size() && !d.found(); ++i) {
    const ImageAttributes& s = stored_images[i];
    const ImageAttributes& r = requested_images[i];
    const std::string w = image_group(static_cast<int64_t>(i)) + ": ";
    d.field(w, "prompt", s.prompt, r.prompt);
    d.field(w, "prompt_2", s.prompt_2, r.prompt_2);
    d.field(w, "negative_prompt", s.negative_prompt, r.negative_prompt);
    d.field(w, "seed", s.seed, r.seed);
    d.field(w, "height", s.height, r.height);
    d.field(w, "width", s.width, r.width);
    d.field(w, "num_inference_steps", s.num_inference_steps, r.num_inference_steps);
    d.field(w, "guidance_scale", s.guidance_scale, r.guidance_scale);
    d.field(w, "true_cfg_scale", s.true_cfg_scale, r.true_cfg_scale);
    d.field(w, "max_sequence_length", s.max_sequence_length, r.max_sequence_length);
    d.field(w, "dtype", s.dtype, r.dtype);
    d.field(w, "number of loras", static_cast<int64_t>(s.loras.size()), static_cast<int64_t>(r.loras.size()));
    for (size_t l = 0; l < s.loras.size() && l < r.loras.size(); ++l) {
      const std::string file = str_cat("loras[", l, "].file"), scale = str_cat("loras[", l, "].scale");
      d.field(w, file.c_str(), s.loras[l].path, r.loras[l].path);
      d.field(w, scale.c_str(), s.loras[l].scale, r.loras[l].scale);
    }
    d.field(w, "vae_tiling", s.vae_tiling, r.vae_tiling);
    d.field(w, "patches", s.patches, r.patches);
    d.field(w, "warmup_steps", s.warmup_steps, r.warmup_steps);
    d.field(w, "pipeline", s.pipeline, r.pipeline);
    d.field(w, "family", s.family, r.family);
    d.field(w, "strength", s.strength, r.strength);
    d.field(w, "t_start", s.t_start, r.t_start);
    for (auto [name, a, b] : {std::tuple<const char*, const ImageAttributes::Input*, const ImageAttributes::Input*>{
                                  "input_image", &s.image, &r.image},
                              {"input_mask", &s.mask, &r.mask},
                              {"input_control_image", &s.control_image, &r.control_image}}) {
      d.field(w, name, a->path, b->path);
      d.field(w, str_cat(name, " size").c_str(), std::vector<int64_t>{a->height, a->width},
              std::vector<int64_t>{b->height, b->width});
    }
    d.field(w, "condition_height", s.condition_height, r.condition_height);
    d.field(w, "condition_width", s.condition_width, r.condition_width);
    d.field(w, "redux model", s.redux.model, r.redux.model);
    d.field(w, "number of redux images", static_cast<int64_t>(s.redux.images.size()),
            static_cast<int64_t>(r.redux.images.size()));
    for (size_t k = 0; k < s.redux.images.size() && k < r.redux.images.size(); ++k) {
      const auto &a = s.redux.images[k], &b = r.redux.images[k];
      d.field(w, str_cat("redux image ", k).c_str(), a.path, b.path);
      d.field(w, str_cat("redux image ", k, " size").c_str(), std::vector<int64_t>{a.height, a.width},
              std::vector<int64_t>{b.height, b.width});
      d.field(w, str_cat("redux prompt scale ", k).c_str(), s.redux.prompt_scales[k], r.redux.prompt_scales[k]);
      d.field(w, str_cat("redux pooled scale ", k).c_str(), s.redux.pooled_scales[k], r.redux.pooled_scales[k]);
    }
    d.field(w, "redux image tokens", s.redux.image_tokens, r.redux.image_tokens);
    d.field(w, "redux zero text", s.redux.zero_text, r.redux.zero_text);
    d.field(w, "number of controlnets", static_cast<int64_t>(s.controlnets.size()), static_cast<int64_t>(r.controlnets.size()));
    for (size_t k = 0; k < s.controlnets.size() && k < r.controlnets.size(); ++k) {
      const ControlNetUse &a = s.controlnets[k], &b = r.controlnets[k];
      auto name = [&](const char* f) { return str_cat("controlnets[", k, "].", f); };
      d.field(w, name("controlnet").c_str(), a.controlnet, b.controlnet);
      d.field(w, name("control_image").c_str(), a.control_image, b.control_image);
      d.field(w, name("control_image size").c_str(), std::vector<int64_t>{a.height, a.width},
              std::vector<int64_t>{b.height, b.width});
      d.field(w, name("mode").c_str(), a.mode, b.mode);
      d.field(w, name("scale").c_str(), a.scale, b.scale);
      d.field(w, name("guidance_start").c_str(), a.guidance_start, b.guidance_start);
      d.field(w, name("guidance_end").c_str(), a.guidance_end, b.guidance_end);
    }
    d.field(w, "reference_images", static_cast<int64_t>(s.references.size()), static_cast<int64_t>(r.references.size()));
    for (size_t k = 0; k < s.references.size() && k < r.references.size(); ++k) {
      const ImageAttributes::Reference &a = s.references[k], &b = r.references[k];
      const std::string name = str_cat("input_image_", k);
      d.field(w, name.c_str(), a.input.path, b.input.path);
      d.field(w, str_cat(name, " size").c_str(), std::vector<int64_t>{a.input.height, a.input.width},
              std::vector<int64_t>{b.input.height, b.input.width});
      d.field(w, str_cat("reference size ", k).c_str(), std::vector<int64_t>{a.height, a.width},
              std::vector<int64_t>{b.height, b.width});
    }
  }
  if (d.found()) throw CheckpointError(str_cat(label, ": ", *d.found(), "; the checkpoint belongs to another job"));
}

std::string iso8601_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace fluxmpi::ckpt
