#include "app/option_checks.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <filesystem>

#include "app/paths.h"
#include "core/log.h"
#include "io/gguf.h"

namespace fluxmpi::app::options {
namespace fs = std::filesystem;

std::string normalise_dtype(const Settings& s) {
  std::string v = s.text("dtype");
  if (v == "auto") return "auto";
  if (v == "fp32" || v == "float32") return "fp32";
  if (v == "bf16" || v == "bfloat16") return "bf16";
  if (v == "fp16" || v == "float16") return "fp16";
  s.fail("dtype", str_cat("must be one of auto, fp32, bf16, fp16, got '", v, "'"));
}

namespace {

bool ends_with_png(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  if (name.size() < 4) return false;
  std::string ext = name.substr(name.size() - 4);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".png";
}

}  // namespace

void check_model(const Settings& s, RunConfig& c) {
  c.model = s.text("model");
  std::error_code ec;
  // Each weight source: a folder or a regular file (what it holds is checked when it is opened).
  auto check_source = [&](const char* name, std::string& out) {
    out = s.text(name);
    if (!s.has(name)) return;
    if (out.empty()) s.fail(name, "must not be empty");
    if (!fs::exists(out, ec)) s.fail(name, str_cat("'", out, "': not found"));
    if (!fs::is_directory(out, ec) && !fs::is_regular_file(out, ec))
      s.fail(name, str_cat("'", out, "': not a folder or a regular file"));
  };
  check_source("transformer", c.transformer);
  if (s.has("gguf")) {
    if (s.has("transformer")) s.fail("gguf", "and --transformer both name the transformer: give one");
    check_source("gguf", c.transformer);
    if (!io::is_gguf_file(c.transformer)) s.fail("gguf", str_cat("'", c.transformer, "': not a GGUF file (no \"GGUF\" magic)"));
  }
  check_source("vae", c.vae);
  check_source("text-encoder", c.text_encoder);
  check_source("text-encoder-2", c.text_encoder_2);
  c.model_config = s.text("model-config");
  if (s.has("model-config") && !fs::is_directory(c.model_config, ec))
    s.fail("model-config", str_cat("'", c.model_config, "': ", fs::exists(c.model_config, ec) ? "not a directory" : "not found"));
  if (c.model.empty()) {
    if (!s.has("resume") && c.transformer.empty())
      s.fail("model", "is required: a diffusers FluxPipeline folder (DIR with model_index.json) or a .safetensors file");
    return;
  }
  if (!fs::exists(c.model, ec)) s.fail("model", str_cat("'", c.model, "': not found"));
  if (!fs::is_directory(c.model, ec) && !fs::is_regular_file(c.model, ec))
    s.fail("model", str_cat("'", c.model, "': not a folder or a regular file"));
}

// The image inputs: absolute paths (their contents are read by prepare_run, before anything
// heavy), the strength within (0, 1].
void check_image_inputs(const Settings& s, RunConfig& c) {
  std::error_code ec;
  // --image is repeatable: a FLUX.2 model's reference images, in order (a FLUX.1 model takes one).
  for (const Settings::Value& v : s.list("image")) {
    if (v.text.empty()) s.fail(v, "image", "must not be empty");
    c.images.push_back(fs::absolute(v.text, ec).lexically_normal().string());
  }
  if (!c.images.empty()) c.image = c.images.front();
  for (auto [name, out] : {std::pair<const char*, std::string*>{"mask", &c.mask}}) {
    if (!s.has(name)) continue;
    *out = s.text(name);
    if (out->empty()) s.fail(name, "must not be empty");
    *out = fs::absolute(*out, ec).lexically_normal().string();
  }
  check_controlnets(s, c);
  c.strength = s.number("strength", 0.0, "must be in (0, 1]");
  if (c.strength && (*c.strength <= 0.0 || *c.strength > 1.0))
    s.fail("strength", str_cat("must be in (0, 1] (1 = the whole schedule), got ", *c.strength));
  c.max_area = s.integer("max-area", 1, kMaxImageSide * kMaxImageSide);
  c.no_auto_resize = s.flag("no-auto-resize");
  c.pipeline = s.text("pipeline");
  if (s.has("pipeline") && c.pipeline.empty()) s.fail("pipeline", "must not be empty");
}

namespace {

// One value of a repeatable option as a number (integer: whole), with the option named.
double list_number(const Settings& s, const Settings::Value& v, const char* name, bool integer) {
  double out = 0;
  int64_t whole = 0;
  const char* end = v.text.data() + v.text.size();
  const auto r = integer ? std::from_chars(v.text.data(), end, whole) : std::from_chars(v.text.data(), end, out);
  if (v.text.empty() || r.ec != std::errc() || r.ptr != end || (!integer && !std::isfinite(out)))
    s.fail(v, name, str_cat("must be ", integer ? "an integer" : "a finite number", ", got '", v.text, "'"));
  return integer ? static_cast<double>(whole) : out;
}

}  // namespace

// --controlnet DIR (folders, absolute) and --control-image FILE (repeatable: with --controlnet the
// ControlNets' images, absolute; without, the one image of a Control model); the values of
// --control-mode, --controlnet-scale and --control-guidance-start/-end (paired with the images and
// the nets once the model is known: pipeline/controlnet_options.h).
void check_controlnets(const Settings& s, RunConfig& c) {
  std::error_code ec;
  for (const Settings::Value& v : s.list("controlnet")) {
    if (v.text.empty()) s.fail(v, "controlnet", "must not be empty");
    if (!fs::is_directory(v.text, ec))
      s.fail(v, "controlnet", str_cat("'", v.text, "': ", fs::exists(v.text, ec) ? "not a folder" : "not found",
                                      " (a FluxControlNetModel folder: config.json and its weights)"));
    c.controlnets.push_back(fs::absolute(v.text, ec).lexically_normal().string());
  }
  std::vector<std::string> images;
  for (const Settings::Value& v : s.list("control-image")) {
    if (v.text.empty()) s.fail(v, "control-image", "must not be empty");
    images.push_back(fs::absolute(v.text, ec).lexically_normal().string());
  }
  if (!c.controlnets.empty()) {
    c.controlnet_images = images;
  } else if (s.has("resume")) {
    // Whose images these are comes from the checkpoint (fill_controlnets_from_checkpoint): a
    // ControlNet job's, or a Control model's one.
    c.controlnet_images = images;
    if (images.size() == 1) c.control_image = images.front();
  } else if (images.size() > 1) {
    s.fail("control-image", str_cat("is given ", images.size(), " times: several control images are for ControlNets "
                                     "(--controlnet DIR); a Control model takes one"));
  } else if (!images.empty()) {
    c.control_image = images.front();
  }
  for (const Settings::Value& v : s.list("control-mode"))
    c.control_modes.push_back(static_cast<int64_t>(list_number(s, v, "control-mode", true)));
  for (const Settings::Value& v : s.list("controlnet-scale")) c.controlnet_scales.push_back(list_number(s, v, "controlnet-scale", false));
  for (const Settings::Value& v : s.list("control-guidance-start"))
    c.control_guidance_starts.push_back(list_number(s, v, "control-guidance-start", false));
  for (const Settings::Value& v : s.list("control-guidance-end"))
    c.control_guidance_ends.push_back(list_number(s, v, "control-guidance-end", false));
  // A resumed run takes its ControlNets from the checkpoint (pipeline/flux1/controlnet_mode.h).
  if (c.controlnets.empty() && !s.has("resume"))
    for (const char* name : {"control-mode", "controlnet-scale", "control-guidance-start", "control-guidance-end"})
      if (s.has(name)) s.fail(name, "needs --controlnet DIR (a FLUX ControlNet folder)");
}

// --lora FILE[:SCALE], in the order given: each file must exist (its contents are checked against
// the model by prepare_run). Stored with the absolute path, so that the other ranks, the checkpoint
// and --resume name the same file.
void check_loras(const Settings& s, RunConfig& c) {
  for (const Settings::Value& v : s.list("lora")) {
    io::LoraSpec spec;
    try {
      spec = io::parse_lora_spec(v.text);
    } catch (const UsageError& e) {
      s.fail(v, "lora", e.what());
    }
    std::error_code ec;
    if (!fs::exists(spec.path, ec)) s.fail(v, "lora", str_cat("'", spec.path, "': not found"));
    if (!fs::is_regular_file(spec.path, ec)) s.fail(v, "lora", str_cat("'", spec.path, "': not a file"));
    spec.path = fs::absolute(spec.path, ec).lexically_normal().string();
    c.loras.push_back(spec);
  }
}

namespace {

// "1,0.6": one finite number per comma-separated field.
std::vector<double> scale_list(const Settings& s, const char* name) {
  std::vector<double> out;
  if (!s.has(name)) return out;
  const std::string text = s.text(name);
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(',', begin);
    const std::string field = text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    double v = 0;
    auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (field.empty() || ec != std::errc() || ptr != field.data() + field.size() || !std::isfinite(v))
      s.fail(name, str_cat("must be a number or comma-separated numbers (one per --redux-image), got '", text, "'"));
    out.push_back(v);
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

}  // namespace

void check_redux(const Settings& s, RunConfig& c) {
  std::error_code ec;
  for (const Settings::Value& v : s.list("redux-image")) {
    if (v.text.empty()) s.fail(v, "redux-image", "must not be empty");
    c.redux_images.push_back(fs::absolute(v.text, ec).lexically_normal().string());
  }
  c.redux_prompt_scales = scale_list(s, "redux-prompt-scale");
  c.redux_pooled_scales = scale_list(s, "redux-pooled-scale");
  if (!s.has("redux-model")) {
    for (const char* name : {"redux-image", "redux-prompt-scale", "redux-pooled-scale"})
      if (s.has(name) && !s.has("resume"))
        s.fail(name, "needs --redux-model (the FLUX.1 Redux folder whose encoders read the images)");
    return;
  }
  c.redux_model = s.text("redux-model");
  if (c.redux_model.empty()) s.fail("redux-model", "must not be empty");
  if (!fs::exists(c.redux_model, ec)) s.fail("redux-model", str_cat("'", c.redux_model, "': not found"));
  if (!fs::is_directory(c.redux_model, ec))
    s.fail("redux-model", str_cat("'", c.redux_model, "': not a folder (a diffusers FluxPriorReduxPipeline folder such as "
                                  "FLUX.1-Redux-dev)"));
  c.redux_model = fs::absolute(c.redux_model, ec).lexically_normal().string();
  if (c.redux_images.empty() && !s.has("resume"))
    s.fail("redux-model", "needs at least one --redux-image (the reference images it encodes)");
  for (auto [name, list] : {std::pair<const char*, const std::vector<double>*>{"redux-prompt-scale", &c.redux_prompt_scales},
                            {"redux-pooled-scale", &c.redux_pooled_scales}})
    if (list->size() > 1 && list->size() != c.redux_images.size())
      s.fail(name, str_cat("gives ", list->size(), " scales for ", c.redux_images.size(),
                           " --redux-image: give one for every image or one per image"));
}

void check_prompts(const Settings& s, RunConfig& c) {
  if (s.has("prompt") && s.has("prompts-file"))
    throw UsageError("--prompt and --prompts-file cannot be used together: give one prompt or a file of prompts");
  for (const char* name : {"prompt", "prompt-2", "negative-prompt"}) s.require_utf8(name);
  if (s.has("prompt")) {
    c.prompts = {s.text("prompt")};
  } else if (s.has("prompts-file")) {
    c.prompts_file = s.text("prompts-file");
    PromptsFile file = read_prompts_or_json_lines(c.prompts_file);
    c.prompts = std::move(file.prompts);
    c.prompt_inputs = std::move(file.inputs);
  } else if (!c.redux_model.empty() && !s.has("resume")) {
    // FluxPriorReduxPipeline without text encoders: the image tokens follow zeros.
    c.prompts = {""};
    c.redux_zero_text = true;
  } else if (!s.has("resume") && !s.flag("dry-run")) {
    throw UsageError("no prompt: give --prompt TEXT or --prompts-file FILE");
  }
  c.prompt_2 = s.text("prompt-2");
  c.negative_prompt = s.has("negative-prompt") ? std::optional<std::string>(s.text("negative-prompt")) : std::nullopt;
  if (c.negative_prompt && c.true_cfg <= 1.0)
    log::warn("--negative-prompt is ignored: true classifier-free guidance needs --true-cfg > 1");
  if (!c.negative_prompt && c.true_cfg > 1.0)
    log::warn("--true-cfg ", c.true_cfg, " is ignored: true classifier-free guidance needs --negative-prompt (\"\" for an empty one)");
}

void check_output_and_checkpoints(const Settings& s, RunConfig& c) {
  c.output = s.text("output");
  const std::string first = image_output_path(c.output, 0, 1);
  std::error_code ec;
  if (!ends_with_png(c.output.empty() ? first : c.output) || fs::is_directory(first, ec))
    s.fail("output", str_cat("must name a .png file (fluxmpi writes PNG images), got '", c.output, "'"));
  // An output directory that depends on {i} is checked per image by build_job().
  if (parent_directory(c.output).find("{i}") == std::string::npos) require_writable_parent(first, "--output");

  c.resume = s.text("resume");
  if (s.has("resume")) {
    if (c.resume.empty()) s.fail("resume", "must name a checkpoint file, got ''");
    if (!fs::exists(c.resume, ec)) s.fail("resume", str_cat("'", c.resume, "': not found"));
    if (fs::is_directory(c.resume, ec)) s.fail("resume", str_cat("'", c.resume, "': is a directory, not a checkpoint file"));
    if (::access(c.resume.c_str(), R_OK | W_OK) != 0)
      s.fail("resume", str_cat("'", c.resume, "': cannot be read and written (a resumed run writes on into it)"));
  }
  c.checkpoint = s.text("checkpoint");
  if (s.has("checkpoint")) {
    if (c.checkpoint.empty()) s.fail("checkpoint", "must name a file, got ''");
    if (!c.resume.empty()) {
      if (!same_file(c.checkpoint, c.resume))
        s.fail("checkpoint", str_cat("'", c.checkpoint, "' and --resume '", c.resume,
                                     "' name different files: a resumed run writes on into the --resume file"));
    } else {
      if (fs::exists(c.checkpoint, ec))
        s.fail("checkpoint", str_cat("'", c.checkpoint, "' already exists; continue it with --resume or remove it"));
      require_writable_parent(c.checkpoint, "--checkpoint");
    }
  }
}

}  // namespace fluxmpi::app::options
