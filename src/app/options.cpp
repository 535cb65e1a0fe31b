#include "app/options.h"

#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <sstream>

#include "app/job.h"
#include "app/paths.h"
#include "core/error.h"
#include "core/version.h"

namespace fluxmpi::app {
namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

enum class Kind { Flag, Text, Integer, Number };
enum class Group { Model, Sampling, Images, Parallel, Output, General };

// One option: its long name is also its INI key.
struct Spec {
  const char* name;
  char short_name;
  Group group;
  Kind kind;
  const char* value_name;  // shown in --help
  const char* fallback;    // default when absent (shown in --help); nullptr = none or model-dependent
  const char* help;
  bool cli_only;           // --config, --help, --version: not INI keys
  bool repeatable = false; // --lora: every occurrence counts (the command line's replace the INI file's)
};

// A side of 65536 pixels is already 16.7M image tokens, far beyond what attention over them can
// hold; the bound keeps the size arithmetic (tokens, bytes) far from overflow.
constexpr int64_t kMaxImageSide = 65536;
// diffusers refuses longer T5 sequences for FLUX (the model was trained with at most 512).
constexpr int64_t kMaxSequenceLength = 512;
// Bounds that keep a typo from allocating terabytes or spawning a million threads: 10000 steps
// is far beyond any FLUX schedule in use (diffusers trains on 1000 timesteps); 1024 threads is
// more than the cores of any node a rank runs on.
constexpr int64_t kMaxSteps = 10000;
constexpr int64_t kMaxThreads = 1024;
constexpr int64_t kMaxRanks = 1 << 24;
constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

const Spec kSpecs[] = {
    {"model", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr,
     "diffusers FluxPipeline folder (FLUX.1-dev or FLUX.1-schnell), or one .safetensors file: a transformer "
     "(original or diffusers keys) or an all-in-one checkpoint; with --resume, default: the one the checkpoint names", false},
    {"transformer", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr,
     "transformer weights replacing --model's: a diffusers component folder or a single file", false},
    {"vae", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr, "VAE weights (diffusers folder, or ae.safetensors-style file)", false},
    {"text-encoder", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr, "CLIP text encoder weights (folder or clip_l.safetensors)", false},
    {"text-encoder-2", 0, Group::Model, Kind::Text, "DIR|FILE", nullptr, "T5 encoder weights (folder or t5xxl_*.safetensors)", false},
    {"model-config", 0, Group::Model, Kind::Text, "DIR", nullptr,
     "diffusers-layout folder whose configs, tokenizers and scheduler describe the weights (its weights are not "
     "read); default: --model when a folder, else the shipped FLUX.1-dev or FLUX.1-schnell configs", false},
    {"dtype", 0, Group::Model, Kind::Text, "auto|fp32|bf16|fp16", "auto",
     "compute dtype; auto: bf16 on cuda and on CPUs with native bf16 (avx512_bf16, amx_bf16), else fp32; "
     "weights of any dtype are converted", false},
    {"lora", 0, Group::Model, Kind::Text, "FILE[:SCALE]", nullptr,
     "merge a LoRA (diffusers/PEFT or kohya safetensors) into the weights, scaled (default 1); repeatable, "
     "stacked in the order given", false, /*repeatable=*/true},

    {"prompt", 0, Group::Sampling, Kind::Text, "TEXT", nullptr, "the prompt (CLIP, and T5 unless --prompt-2)", false},
    {"prompts-file", 0, Group::Sampling, Kind::Text, "FILE", nullptr,
     "UTF-8 file with one prompt per line (blank lines skipped); instead of --prompt", false},
    {"prompt-2", 0, Group::Sampling, Kind::Text, "TEXT", nullptr, "prompt of the T5 encoder for every image (default: the prompt)", false},
    {"negative-prompt", 0, Group::Sampling, Kind::Text, "TEXT", nullptr,
     "negative prompt of every image; used with --true-cfg > 1", false},
    {"true-cfg", 0, Group::Sampling, Kind::Number, "SCALE", "1",
     "true classifier-free guidance scale (> 1 with --negative-prompt: two transformer passes per step)", false},
    {"num-images", 0, Group::Sampling, Kind::Integer, "N", "1", "images per prompt", false},
    {"seed", 0, Group::Sampling, Kind::Integer, "S", nullptr, "image i of the job uses seed S + i (default: random, printed)", false},
    {"height", 0, Group::Sampling, Kind::Integer, "PIXELS", nullptr,
     "image height (default 1024), floored to a multiple of 2 x VAE scale factor (16)", false},
    {"width", 0, Group::Sampling, Kind::Integer, "PIXELS", nullptr, "image width (default 1024), floored likewise", false},
    {"steps", 0, Group::Sampling, Kind::Integer, "N", nullptr,
     "denoising steps (default: 28 for dev, 4 for schnell; FLUX.2: 4 klein, 50 klein base and dev)", false},
    {"guidance", 0, Group::Sampling, Kind::Number, "SCALE", nullptr,
     "guidance scale of dev (default 3.5); schnell has no guidance and ignores it; FLUX.2: diffusers' guidance_scale "
     "(default 4; klein ignores it, klein base runs true CFG when > 1)", false},
    {"max-sequence-length", 0, Group::Sampling, Kind::Integer, "N", nullptr,
     "T5 tokens, 1..512 (default: 512 for dev, 256 for schnell; FLUX.2: text-encoder tokens, default 512)", false},
    {"text-encoder-layers", 0, Group::Sampling, Kind::Text, "A,B,C", nullptr,
     "FLUX.2: the text encoder's hidden states stacked into the prompt embedding (diffusers' "
     "text_encoder_out_layers; default 10,20,30 for dev, 9,18,27 for klein)", false},

    // Image inputs (docs/images.md): the mode follows from the model and the images given.
    {"image", 0, Group::Images, Kind::Text, "FILE", nullptr,
     "PNG/JPEG/WebP input: img2img on a FLUX.1 model, inpainting with --mask, Fill (FluxFillPipeline) with --mask, "
     "the image to edit on a Kontext model", false},
    {"mask", 0, Group::Images, Kind::Text, "FILE", nullptr, "inpainting mask, white = repaint (resized to the image, binarised at 50 %)", false},
    {"control-image", 0, Group::Images, Kind::Text, "FILE", nullptr,
     "the edge or depth map of a FLUX.1 Canny/Depth model (FluxControlPipeline)", false},
    {"strength", 0, Group::Images, Kind::Number, "S", nullptr,
     "img2img/inpaint/Fill: how much of the schedule runs, 0 < S <= 1 (default 0.6; Fill 1)", false},
    {"pipeline", 0, Group::Images, Kind::Text, "NAME", nullptr,
     "text2img|img2img|inpaint|fill|control|kontext (or the diffusers class name): when the model folder does not "
     "say, e.g. a Kontext single file", false},
    {"max-area", 0, Group::Images, Kind::Integer, "PIXELS", "1048576",
     "Kontext: the output's pixel count; its aspect is the requested --width/--height's (1024x1024 when not given)", false},
    {"no-auto-resize", 0, Group::Images, Kind::Flag, nullptr, nullptr,
     "Kontext: encode the image at its own size (floored to 16), not at the preferred Kontext resolution", false},

    {"device", 0, Group::Parallel, Kind::Text, "cpu|cuda", "cpu", "rank r uses cuda:<local rank mod GPUs>, or the CPU", false},
    {"threads", 0, Group::Parallel, Kind::Integer, "N", "0", "CPU threads per rank; 0 = max(1, cores of the node / ranks on it)", false},
    {"balance", 0, Group::Parallel, Kind::Text, "compute|memory", "compute",
     "compute: even block counts (FLOPs); memory: the smallest estimated peak memory per rank (weights, "
     "activations and rank 0's encode/decode stages), then the next largest, ...", false},
    {"partition", 0, Group::Parallel, Kind::Text, "PLAN", nullptr, "explicit blocks per rank, e.g. 0:0-8,1:9-56 (overrides --balance)", false},
    {"max-memory", 0, Group::Parallel, Kind::Text, "BUDGETS", nullptr,
     "memory budget of every rank (16GiB, 16G) or per rank (0=16GiB,1=24GiB)", false},
    {"stages", 0, Group::Parallel, Kind::Integer, "S", nullptr,
     "ranks per pipeline: the P ranks form P/S pipelines of S consecutive ranks, each leader taking the next images "
     "whenever it has room; one checkpoint, written by rank 0 (default: all P ranks, one pipeline)", false},
    {"microbatch", 0, Group::Parallel, Kind::Integer, "N", "1",
     "images per transformer pass (1: bit-identical to one image at a time)", false},
    {"keep-encoders", 0, Group::Parallel, Kind::Flag, nullptr, nullptr, "keep the text encoders loaded on rank 0 after encoding", false},
    // VAE decoding (diffusers enable_tiling / enable_slicing).
    {"vae-tiling", 0, Group::Parallel, Kind::Flag, nullptr, nullptr,
     "decode in overlapping tiles, blended (less memory for large images; on by itself when --max-memory needs it)", false},
    {"vae-slicing", 0, Group::Parallel, Kind::Flag, nullptr, nullptr,
     "decode the images of a microbatch one at a time", false},
    {"patches", 0, Group::Parallel, Kind::Integer, "M", "1",
     "patch pipelining: after the warm-up, each step's image flows through the ranks as M patches of latent rows, "
     "attending to the previous step's keys/values of the patches not yet seen (approximate; 1 = exact)", false},
    {"warmup-steps", 0, Group::Parallel, Kind::Integer, "W", "1",
     "with --patches > 1: the first W steps of each image run exact and fill the key/value buffers", false},

    {"output", 'o', Group::Output, Kind::Text, "PATH", nullptr,
     "PNG file; {i} = image index, 5 digits (default: fluxmpi.png, or fluxmpi-{i}.png for several images)", false},
    {"checkpoint", 0, Group::Output, Kind::Text, "FILE.h5", nullptr, "write every step to this new HDF5 file", false},
    {"checkpoint-every", 0, Group::Output, Kind::Integer, "K", "1", "keep the latents of every K-th step (and of the last)", false},
    {"resume", 0, Group::Output, Kind::Text, "FILE.h5", nullptr,
     "continue the unfinished images of a checkpoint, writing on into it; omitted prompts and sampling options come from it", false},
    {"no-progress", 0, Group::Output, Kind::Flag, nullptr, nullptr, "no progress bar or progress lines", false},

    {"config", 0, Group::General, Kind::Text, "FILE.ini", nullptr, "read options from an INI file (the command line wins)", true},
    {"dry-run", 0, Group::General, Kind::Flag, nullptr, nullptr,
     "print the job and the partition plan and exit; checks every component's weight headers, reads no weights", false},
    {"predict", 0, Group::General, Kind::Text, "PROFILE.json", nullptr,
     "with --dry-run: also print the schedule model's prediction for the job (images/hour, one image's latency, each "
     "rank's idle share) from a tools/sim profile; runs python3", false},
    {"log-level", 0, Group::General, Kind::Text, "LEVEL", "info", "error | warn | info | debug", false},
    {"help", 'h', Group::General, Kind::Flag, nullptr, nullptr, "print this help and exit", true},
    {"version", 0, Group::General, Kind::Flag, nullptr, nullptr, "print the version and exit", true},
};

const Spec* find_spec(const std::string& name) {
  for (const Spec& s : kSpecs)
    if (name == s.name) return &s;
  return nullptr;
}

const char* group_caption(Group g) {
  switch (g) {
    case Group::Model: return "Model";
    case Group::Sampling: return "Sampling";
    case Group::Images: return "Image input";
    case Group::Parallel: return "Parallel";
    case Group::Output: return "Output";
    case Group::General: return "General";
  }
  return "";
}

// The Boost table of one group. On the command line flags take no value; in the INI file every
// key takes one (flags "true"/"false"). Values stay strings: converting them here gives messages
// that name the option and the value, which Boost's lexical casts do not.
po::options_description group_table(Group group, bool for_ini) {
  po::options_description table(str_cat(group_caption(group), " options"), 100, 50);
  for (const Spec& s : kSpecs) {
    if (s.group != group || (for_ini && s.cli_only)) continue;
    std::string names = s.short_name ? str_cat(s.name, ",", s.short_name) : std::string(s.name);
    if (s.kind == Kind::Flag && !for_ini) {
      table.add_options()(names.c_str(), po::bool_switch(), s.help);
      continue;
    }
    auto* value = po::value<std::string>();
    if (s.value_name) value->value_name(s.value_name);
    if (s.fallback) value->default_value(s.fallback);
    table.add_options()(names.c_str(), value, s.help);
  }
  return table;
}

po::options_description full_table(bool for_ini) {
  po::options_description all;
  for (Group g : {Group::Model, Group::Sampling, Group::Images, Group::Parallel, Group::Output, Group::General})
    all.add(group_table(g, for_ini));
  return all;
}

// The raw option values, each with where it came from.
class Settings {
 public:
  struct Value {
    std::string text;
    std::string source;  // "" = command line, else the INI file
  };

  bool has(const std::string& name) const { return values_.count(name) != 0 || lists_.count(name) != 0; }
  void set(const std::string& name, Value v) { values_[name] = std::move(v); }
  // Repeatable options: every value in order.
  void append(const std::string& name, Value v) { lists_[name].push_back(std::move(v)); }
  std::vector<Value> list(const std::string& name) const {
    auto it = lists_.find(name);
    return it == lists_.end() ? std::vector<Value>() : it->second;
  }
  std::set<std::string> names() const {
    std::set<std::string> out;
    for (const auto& [name, v] : values_) out.insert(name);
    for (const auto& [name, v] : lists_) out.insert(name);
    return out;
  }

  [[noreturn]] void fail(const std::string& name, const std::string& problem) const {
    auto it = values_.find(name);
    std::string where = it != values_.end() && !it->second.source.empty()
                            ? str_cat(" (set in config file '", it->second.source, "')")
                            : std::string();
    throw UsageError(str_cat("--", name, " ", problem, where));
  }
  [[noreturn]] void fail(const Value& v, const std::string& name, const std::string& problem) const {
    throw UsageError(str_cat("--", name, " ", problem,
                             v.source.empty() ? std::string() : str_cat(" (set in config file '", v.source, "')")));
  }

  std::optional<std::string> optional_text(const std::string& name) const {
    auto it = values_.find(name);
    if (it != values_.end()) return it->second.text;
    const Spec* spec = find_spec(name);
    if (spec && spec->fallback) return std::string(spec->fallback);
    return std::nullopt;
  }
  std::string text(const std::string& name) const { return optional_text(name).value_or(""); }

  std::string choice(const std::string& name, std::initializer_list<const char*> allowed) const {
    std::string v = text(name);
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return v;
      list += list.empty() ? a : str_cat(", ", a);
    }
    fail(name, str_cat("must be one of ", list, ", got '", v, "'"));
  }

  std::optional<int64_t> integer(const std::string& name, int64_t min, int64_t max) const {
    auto v = optional_text(name);
    if (!v) return std::nullopt;
    int64_t out = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
    if (ec == std::errc::result_out_of_range) fail(name, str_cat("is out of range, got '", *v, "'"));
    if (ec != std::errc() || end != v->data() + v->size() || v->empty())
      fail(name, str_cat("must be an integer, got '", *v, "'"));
    if (out < min) {
      std::string rule = min == 1 ? std::string("must be positive")
                         : min == 0 ? std::string("must not be negative")
                                    : str_cat("must be at least ", min);
      fail(name, str_cat(rule, ", got ", out));
    }
    if (out > max) fail(name, str_cat("must be at most ", max, ", got ", out));
    return out;
  }

  // A finite number >= min; `rule` says why when it is smaller.
  std::optional<double> number(const std::string& name, double min, const std::string& rule) const {
    auto v = optional_text(name);
    if (!v) return std::nullopt;
    double out = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
    if (ec != std::errc() || end != v->data() + v->size() || v->empty())
      fail(name, str_cat("must be a number, got '", *v, "'"));
    if (!std::isfinite(out)) fail(name, str_cat("must be a finite number, got '", *v, "'"));
    if (out < min) fail(name, str_cat(rule, ", got ", *v));
    return out;
  }

  bool flag(const std::string& name) const {
    auto v = optional_text(name);
    if (!v) return false;
    std::string t = *v;
    std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
    if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
    if (t == "false" || t == "no" || t == "off" || t == "0") return false;
    fail(name, str_cat("must be true or false, got '", *v, "'"));
  }

  void require_utf8(const std::string& name) const {
    auto v = optional_text(name);
    if (!v) return;
    size_t bad = find_invalid_utf8(*v);
    if (bad != std::string_view::npos) fail(name, str_cat("is not valid UTF-8 (byte ", bad + 1, ")"));
  }

 private:
  std::map<std::string, Value> values_;
  std::map<std::string, std::vector<Value>> lists_;
};

// --- Reading the command line and the INI file -------------------------------------------------

void read_command_line(const std::vector<std::string>& args, Settings& settings) {
  po::options_description table = full_table(false);
  po::options_description hidden;
  hidden.add_options()("unexpected-argument", po::value<std::vector<std::string>>());
  table.add(hidden);
  po::positional_options_description positional;
  positional.add("unexpected-argument", -1);
  // No abbreviations: `--step` must not silently mean `--steps`.
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::command_line_parser(args).options(table).positional(positional).style(style).run();
  } catch (const po::unknown_option& e) {
    throw UsageError(str_cat("unknown option '", e.get_option_name(), "' (see fluxmpi --help)"));
  } catch (const po::invalid_command_line_syntax& e) {
    if (e.kind() == po::invalid_syntax::missing_parameter)
      throw UsageError(str_cat(e.get_option_name(), " needs a value"));
    if (e.kind() == po::invalid_syntax::extra_parameter)
      throw UsageError(str_cat(e.get_option_name(), " takes no value"));
    throw UsageError(e.what());
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  for (const po::option& o : parsed.options) {
    if (o.string_key == "unexpected-argument")
      throw UsageError(str_cat("unexpected argument '", o.value.empty() ? "" : o.value.front(),
                               "' (every value follows its option, e.g. --prompt \"a cat\")"));
    const Spec* spec = find_spec(o.string_key);
    if (spec != nullptr && spec->repeatable) {
      settings.append(o.string_key, {o.value.empty() ? std::string() : o.value.front(), ""});
      continue;
    }
    if (settings.has(o.string_key)) throw UsageError(str_cat("--", o.string_key, " is given more than once"));
    settings.set(o.string_key, {o.value.empty() ? "true" : o.value.front(), ""});
  }
}

// INI values may be quoted to keep leading or trailing spaces: "a cat" -> a cat.
std::string unquote(const std::string& v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  return v;
}

// One prompt source: a command-line --prompt replaces an INI prompts-file and vice versa.
bool is_prompt_source(const std::string& key) { return key == "prompt" || key == "prompts-file"; }

void read_config_file(const std::string& path, Settings& settings) {
  const std::string label = str_cat("config file '", path, "'");
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(str_cat("--config '", path, "': not found"));
  if (fs::is_directory(path, ec)) throw UsageError(str_cat("--config '", path, "': is a directory, not a file"));
  std::ifstream in(path);
  if (!in) throw UsageError(str_cat("--config '", path, "': cannot be read"));
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::parse_config_file(in, full_table(true), /*allow_unregistered=*/true);
  } catch (const po::invalid_config_file_syntax& e) {
    throw UsageError(str_cat(label, ": invalid line '", e.tokens(), "' (expected key = value)"));
  } catch (const po::error& e) {
    throw UsageError(str_cat(label, ": ", e.what()));
  }
  const bool cli_prompt = settings.has("prompt") || settings.has("prompts-file");
  std::set<std::string> seen;
  std::set<std::string> cli_lists;  // repeatable options given on the command line: the INI's lines are ignored
  for (const Spec& s : kSpecs)
    if (s.repeatable && settings.has(s.name)) cli_lists.insert(s.name);
  for (const po::option& o : parsed.options) {
    const std::string& key = o.string_key;
    if (o.unregistered) {
      const Spec* spec = find_spec(key);
      std::string hint = spec && spec->cli_only ? str_cat(" ('", key, "' can only be given on the command line)")
                         : key.find('.') != std::string::npos
                             ? std::string(" (keys are the long option names at the top level, without [sections])")
                             : std::string(" (keys are the long option names, see fluxmpi --help)");
      throw UsageError(str_cat(label, ": unknown key '", key, "'", hint));
    }
    if (const Spec* spec = find_spec(key); spec != nullptr && spec->repeatable) {
      if (!cli_lists.count(key)) settings.append(key, {unquote(o.value.empty() ? std::string() : o.value.front()), path});
      continue;
    }
    if (!seen.insert(key).second) throw UsageError(str_cat(label, ": key '", key, "' is set more than once"));
    if (settings.has(key) || (cli_prompt && is_prompt_source(key))) continue;  // the command line wins
    settings.set(key, {unquote(o.value.empty() ? std::string() : o.value.front()), path});
  }
}

// --- Validation --------------------------------------------------------------------------------

std::string normalise_dtype(const Settings& s) {
  std::string v = s.text("dtype");
  if (v == "auto") return "auto";
  if (v == "fp32" || v == "float32") return "fp32";
  if (v == "bf16" || v == "bfloat16") return "bf16";
  if (v == "fp16" || v == "float16") return "fp16";
  s.fail("dtype", str_cat("must be one of auto, fp32, bf16, fp16, got '", v, "'"));
}

bool ends_with_png(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  if (name.size() < 4) return false;
  std::string ext = name.substr(name.size() - 4);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".png";
}

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
  for (auto [name, out] : {std::pair<const char*, std::string*>{"image", &c.image}, {"mask", &c.mask},
                           {"control-image", &c.control_image}}) {
    if (!s.has(name)) continue;
    *out = s.text(name);
    if (out->empty()) s.fail(name, "must not be empty");
    *out = fs::absolute(*out, ec).lexically_normal().string();
  }
  c.strength = s.number("strength", 0.0, "must be in (0, 1]");
  if (c.strength && (*c.strength <= 0.0 || *c.strength > 1.0))
    s.fail("strength", str_cat("must be in (0, 1] (1 = the whole schedule), got ", *c.strength));
  c.max_area = s.integer("max-area", 1, kMaxImageSide * kMaxImageSide);
  c.no_auto_resize = s.flag("no-auto-resize");
  c.pipeline = s.text("pipeline");
  if (s.has("pipeline") && c.pipeline.empty()) s.fail("pipeline", "must not be empty");
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

RunConfig validate(const Settings& s) {
  RunConfig c;
  c.given = s.names();
  c.config_file = s.text("config");
  c.log_level = log::parse_level(s.choice("log-level", {"error", "warn", "info", "debug"}));
  c.device = s.choice("device", {"cpu", "cuda"});
  c.dtype = normalise_dtype(s);  // "auto" by default: prepare_run resolves it (app/defaults.h)

  c.true_cfg = *s.number("true-cfg", 1.0, "must be at least 1 (1 disables true classifier-free guidance)");
  c.num_images = *s.integer("num-images", 1, kMaxImages);
  c.seed = s.integer("seed", 0, kNoMax);
  c.height = s.integer("height", 1, kMaxImageSide);
  c.width = s.integer("width", 1, kMaxImageSide);
  c.steps = s.integer("steps", 1, kMaxSteps);
  c.guidance = s.number("guidance", 0.0, "must not be negative");
  c.max_sequence_length = s.integer("max-sequence-length", 1, kMaxSequenceLength);

  c.threads = *s.integer("threads", 0, kMaxThreads);
  c.balance = s.choice("balance", {"compute", "memory"});
  if (s.has("text-encoder-layers")) {
    // "9,18,27": non-negative layer indices (0 = the embeddings), checked against the encoder's
    // depth once the model is known.
    const std::string text = s.text("text-encoder-layers");
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = std::min(text.find(',', start), text.size());
      const std::string item = text.substr(start, comma - start);
      int64_t v = -1;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
        s.fail("text-encoder-layers", str_cat("must be comma-separated layer indices >= 0 (e.g. 9,18,27), got '", text, "'"));
      c.text_encoder_layers.push_back(v);
      start = comma + 1;
    }
  }
  c.partition = s.text("partition");
  if (s.has("partition") && c.partition.empty()) s.fail("partition", "must not be empty (e.g. 0:0-8,1:9-56)");
  c.max_memory = s.text("max-memory");
  if (s.has("max-memory") && c.max_memory.empty()) s.fail("max-memory", "must not be empty (e.g. 0=16GiB,1=24GiB)");
  c.stages = s.integer("stages", 1, kMaxRanks).value_or(0);
  c.microbatch = *s.integer("microbatch", 1, kNoMax);
  c.keep_encoders = s.flag("keep-encoders");
  c.vae_tiling = s.flag("vae-tiling");
  c.vae_slicing = s.flag("vae-slicing");
  c.patches = *s.integer("patches", 1, kMaxSteps);
  c.warmup_steps = *s.integer("warmup-steps", 1, kMaxSteps);
  c.checkpoint_every = *s.integer("checkpoint-every", 1, kNoMax);
  c.no_progress = s.flag("no-progress");
  c.dry_run = s.flag("dry-run");
  c.predict = s.text("predict");
  if (s.has("predict") && c.predict.empty()) s.fail("predict", "must name a profile (e.g. tools/sim/profiles/local-cpu.json)");
  if (!c.predict.empty() && !c.dry_run) s.fail("predict", "needs --dry-run (the prediction is for the job a dry run describes)");

  check_model(s, c);
  check_loras(s, c);
  check_image_inputs(s, c);
  check_prompts(s, c);
  check_output_and_checkpoints(s, c);
  return c;
}

}  // namespace

ParseResult parse_options(const std::vector<std::string>& args) {
  Settings settings;
  read_command_line(args, settings);
  ParseResult result;
  if (settings.has("help")) {
    result.action = ParseResult::Action::Help;
    result.text = help_text();
    return result;
  }
  if (settings.has("version")) {
    result.action = ParseResult::Action::Version;
    result.text = version_text();
    return result;
  }
  if (settings.has("config")) read_config_file(settings.text("config"), settings);
  result.config = validate(settings);
  return result;
}

ParseResult parse_options(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_options(args);
}

std::string help_text() {
  std::ostringstream os;
  os << "Usage: fluxmpi --model DIR|FILE (--prompt TEXT | --prompts-file FILE) [options]\n"
        "       mpirun -np P fluxmpi ...   (the transformer's blocks are split over the P ranks)\n"
        "       fluxmpi --resume RUN.h5 [options]\n\n"
        "FLUX.1 text-to-image inference (diffusers FluxPipeline semantics).\n"
     << full_table(false)
     << "\nEvery option except --config, --help and --version can also be set in the INI file given to\n"
        "--config, one `long-option-name = value` per line (flags: true/false); the command line wins.\n"
        "Exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 bad input data (model files, checkpoint).\n";
  return os.str();
}

std::string version_text() { return str_cat("fluxmpi ", kVersion, " (libtorch ", TORCH_VERSION, ")\n"); }

}  // namespace fluxmpi::app
