#include "inspect.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "core/error.h"
#include "diff.h"
#include "io/png.h"

namespace fluxmpi::inspect {
namespace {

std::string cell(const char* format, double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string row_text(const std::vector<std::pair<int, std::string>>& cells) {
  std::string s;
  for (const auto& [width, text] : cells) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "%-*s", width, text.c_str());
    s += buf;
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string progress(const ckpt::ImageAttributes& a, const ckpt::ImageState& s) {
  return str_cat(s.last_step + 1, "/", a.num_inference_steps - a.t_start);  // the steps that run (img2img: fewer)
}

// "exact steps 0-1, 4; pipelined 2-3, 5" over the steps run so far.
std::string step_modes(const at::Tensor& exact, int64_t last_step) {
  std::string ranges[2];
  for (int64_t k = 0; k <= last_step; ++k) {
    const int mode = exact[k].item<int64_t>() != 0 ? 0 : 1;
    if (k > 0 && (exact[k - 1].item<int64_t>() != 0 ? 0 : 1) == mode) continue;
    int64_t end = k;
    while (end + 1 <= last_step && (exact[end + 1].item<int64_t>() != 0 ? 0 : 1) == mode) ++end;
    ranges[mode] += str_cat(ranges[mode].empty() ? "" : ", ", k, end > k ? str_cat("-", end) : std::string());
  }
  return str_cat("exact steps ", ranges[0].empty() ? "none" : ranges[0], "; pipelined ",
                 ranges[1].empty() ? "none" : ranges[1]);
}

void print_summary(const ckpt::CheckpointReader& r, std::optional<int64_t> only, std::ostream& out) {
  const ckpt::FileAttributes& f = r.file();
  const io::TransformerConfig& c = r.transformer_config();
  out << r.path() << ": fluxmpi checkpoint, format " << f.format_version << ", written by fluxmpi "
      << f.fluxmpi_version << ", created " << f.created << "\n";
  out << "model: " << f.model << " (" << c.num_layers << " double + " << c.num_single_layers << " single blocks, "
      << c.num_attention_heads << " x " << c.attention_head_dim << " heads, "
      << (c.guidance_embeds ? "guidance embedding" : "no guidance embedding") << ")\n";
  const std::vector<int> w = {7, 11, 9, 12, 11, 7};
  out << row_text({{w[0], "image"}, {w[1], "status"}, {w[2], "steps"}, {w[3], "seed"}, {w[4], "size"},
                   {w[5], "dtype"}, {0, "prompt"}})
      << "\n";
  for (int64_t i = 0; i < r.num_images(); ++i) {
    if (only && *only != i) continue;
    const ckpt::ImageAttributes& a = r.attributes(i);
    ckpt::ImageState s = r.state(i);
    out << row_text({{w[0], ckpt::image_group(i).substr(std::string("/images/").size())},
                     {w[1], ckpt::status_name(s.status)},
                     {w[2], progress(a, s)},
                     {w[3], std::to_string(a.seed)},
                     {w[4], str_cat(a.height, "x", a.width)},
                     {w[5], a.dtype},
                     {0, "\"" + shorten(a.prompt, 48) + "\""}})
        << "\n";
  }
  // Image inputs: the pipeline, its inputs, the strength and where the schedule was cut.
  for (int64_t i = 0; i < r.num_images(); ++i) {
    const ckpt::ImageAttributes& a = r.attributes(i);
    if ((only && *only != i) || a.pipeline == "text2img") continue;
    out << "  " << ckpt::image_group(i).substr(std::string("/images/").size()) << ": " << a.pipeline;
    for (auto [what, in] : {std::pair<const char*, const ckpt::ImageAttributes::Input*>{"image", &a.image},
                            {"mask", &a.mask},
                            {"control image", &a.control_image}})
      if (!in->path.empty()) out << ", " << what << " " << in->path << " (" << in->width << "x" << in->height << ")";
    for (size_t k = 0; k < a.references.size(); ++k) {
      const ckpt::ImageAttributes::Reference& ref = a.references[k];
      out << ", reference " << k << " " << ref.input.path << " (" << ref.input.width << "x" << ref.input.height
          << ", encoded at " << ref.width << "x" << ref.height << ")";
    }
    if (a.pipeline == "img2img" || a.pipeline == "inpaint" || a.pipeline == "fill")
      out << ", strength " << a.strength << " (steps " << a.t_start << "-" << a.num_inference_steps - 1 << " of "
          << a.num_inference_steps << ")";
    out << "\n";
  }
  // Patch pipelining (--patches): the mode, and which of the steps run so far were exact.
  for (int64_t i = 0; i < r.num_images(); ++i) {
    if ((only && *only != i) || !r.shape(i).patched) continue;
    const ckpt::ImageAttributes& a = r.attributes(i);
    out << "  " << ckpt::image_group(i).substr(std::string("/images/").size()) << ": patch-pipelined, " << a.patches
        << " patches, " << a.warmup_steps << " warm-up step(s); "
        << step_modes(r.dataset(i, "latents/exact"), r.state(i).last_step) << "\n";
  }
}

void print_stats(const ckpt::CheckpointReader& r, std::optional<int64_t> only, std::optional<int64_t> step,
                 std::ostream& out) {
  const std::vector<int> w = {8, 12, 13, 13, 13, 13, 13};
  auto stats_row = [&](const std::string& label, double sigma, const at::Tensor& x) {
    at::Tensor d = x.to(at::kDouble);
    out << row_text({{w[0], "  " + label},
                     {w[1], cell("%.6g", sigma)},
                     {w[2], cell("%.6g", d.mean().item<double>())},
                     {w[3], cell("%.6g", d.std(/*unbiased=*/false).item<double>())},
                     {w[4], cell("%.6g", d.min().item<double>())},
                     {w[5], cell("%.6g", d.max().item<double>())},
                     {w[6], cell("%.6g", d.norm().item<double>())}})
        << "\n";
  };
  for (int64_t i = 0; i < r.num_images(); ++i) {
    if (only && *only != i) continue;
    const ckpt::ImageAttributes& a = r.attributes(i);
    ckpt::ImageState s = r.state(i);
    out << "\n" << ckpt::image_group(i) << "  \"" << shorten(a.prompt, 48) << "\"  " << a.height << "x" << a.width
        << ", " << ckpt::status_name(s.status) << ", step " << progress(a, s) << ", " << s.rows << " row(s) stored\n";
    out << row_text({{w[0], "  step"}, {w[1], "sigma"}, {w[2], "mean"}, {w[3], "std"}, {w[4], "min"}, {w[5], "max"},
                     {w[6], "L2 norm"}})
        << "\n";
    if (s.status == ckpt::ImageStatus::Encoding) {
      out << "  (no latents yet)\n";
      continue;
    }
    at::Tensor sigmas = r.sigmas(i);
    if (!step || *step == -1) stats_row("init", sigmas[0].item<double>(), r.initial_latents(i));
    std::vector<int64_t> steps = r.step_indices(i);
    for (int64_t k = 0; k < static_cast<int64_t>(steps.size()); ++k) {
      if (step && *step != steps[k]) continue;
      stats_row(std::to_string(steps[k]), sigmas[steps[k] + 1].item<double>(), r.row(i, k).latents);
    }
  }
}

void check_options(const InspectOptions& o) {
  const bool picture = !o.preview.empty() || !o.decode.empty();
  if (o.follow && (o.stats || picture || !o.diff.empty()))
    throw UsageError("--follow cannot be combined with --stats, --preview, --decode or --diff");
  if (!o.diff.empty() && (o.stats || picture))
    throw UsageError("--diff cannot be combined with --stats, --preview or --decode");
  if (o.decode.empty() && !o.model.empty()) throw UsageError("--model is only used by --decode");
  if (o.tol && o.diff.empty()) throw UsageError("--tol is only used by --diff");
  if (o.tol && !(*o.tol >= 0)) throw UsageError(str_cat("--tol must be >= 0, got ", *o.tol));
  if (o.latent && !picture) throw UsageError("--latent is only used by --preview and --decode");
  if (o.latent) parse_latent_kind(*o.latent);
  if (o.step && !picture && !o.stats) throw UsageError("--step is only used by --stats, --preview and --decode");
  if (o.step && *o.step < -1) throw UsageError(str_cat("--step must be >= -1 (-1: the initial noise), got ", *o.step));
  if ((o.timeout || o.interval) && !o.follow) throw UsageError("--timeout and --interval are only used by --follow");
  if (o.timeout && !(*o.timeout > 0)) throw UsageError(str_cat("--timeout must be > 0 seconds, got ", *o.timeout));
  if (o.interval && !(*o.interval > 0)) throw UsageError(str_cat("--interval must be > 0 seconds, got ", *o.interval));
}

void check_image(const ckpt::CheckpointReader& r, std::optional<int64_t> image) {
  if (image && (*image < 0 || *image >= r.num_images()))
    throw UsageError(str_cat("--image ", *image, ": ", r.path(), " holds images 0..", r.num_images() - 1));
}

// The VAE --decode uses: --model (a pipeline folder, or a single file holding the VAE, described
// by the configs the checkpoint records), else the one the checkpoint records. UsageError when
// neither names one.
io::ModelSources decode_sources(const InspectOptions& o, const ckpt::CheckpointReader& r) {
  const ckpt::FileAttributes::Sources& rec = r.file().sources;
  io::ModelSources sources;
  std::error_code ec;
  if (!o.model.empty() && !std::filesystem::is_regular_file(o.model, ec)) {
    sources.model = o.model;
    return sources;
  }
  if (rec.model_config.empty())
    throw UsageError(str_cat("--decode: ", r.path(), " records no model config (an older checkpoint): give --model DIR, "
                             "the model folder the run used"));
  sources.vae = o.model.empty() ? rec.vae : o.model;
  sources.transformer = rec.transformer;
  sources.model_config = rec.model_config;
  if (sources.vae.empty()) throw UsageError(str_cat("--decode: ", r.path(), " records no VAE: give --model DIR|FILE"));
  return sources;
}

int write_pictures(const InspectOptions& o, const ckpt::CheckpointReader& r, std::ostream& out) {
  const int64_t i = o.image.value_or(0);
  const LatentKind kind = o.latent ? parse_latent_kind(*o.latent) : LatentKind::X0;
  SelectedLatents sel = select_latents(r, i, o.step, kind);
  const ckpt::ImageAttributes& a = r.attributes(i);
  auto text = [&](const std::string& how) {
    return std::vector<std::pair<std::string, std::string>>{
        {"Source", r.path()}, {"Image", ckpt::image_group(i)}, {"Latents", sel.description},
        {"Rendering", how},   {"prompt", a.prompt},             {"seed", std::to_string(a.seed)}};
  };
  if (!o.preview.empty()) {
    io::RgbImage img = latent_preview(sel.packed, r.shape(i), r.file().vae_scale_factor);
    io::write_png(o.preview, img, text("linear latent-to-RGB preview"));
    out << "wrote " << o.preview << ": " << ckpt::image_group(i) << ", " << sel.description << ", linear preview "
        << img.width << "x" << img.height << "\n";
  }
  if (!o.decode.empty()) {
    const io::ModelSources sources = decode_sources(o, r);
    io::RgbImage img = decode_latents(sel.packed, r.shape(i), sources);
    io::write_png(o.decode, img, text("VAE decode with " + (sources.model.empty() ? sources.vae : sources.model)));
    out << "wrote " << o.decode << ": " << ckpt::image_group(i) << ", " << sel.description << ", decoded by the VAE "
        << img.width << "x" << img.height << "\n";
  }
  return 0;
}

// Reopens the file every interval (each open is a fresh SWMR view) and prints a line whenever an
// image's status or step changes, until every image is decoded or the timeout passes.
int follow(const InspectOptions& o, std::ostream& out) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto interval = std::chrono::duration<double>(o.interval.value_or(1.0));
  auto timed_out = [&] {
    return o.timeout && std::chrono::duration<double>(Clock::now() - start).count() >= *o.timeout;
  };
  std::vector<std::string> shown;
  bool waiting_shown = false;
  out << "following " << o.file << " (Ctrl-C to stop)" << std::endl;
  for (;;) {
    std::optional<ckpt::CheckpointReader> r;
    try {
      r.emplace(ckpt::CheckpointReader::open(o.file));
    } catch (const CheckpointError& e) {
      // Not there yet, or locked while the job creates it: wait. Anything else is a bad file.
      std::error_code ec;
      const bool transient = !std::filesystem::exists(o.file, ec) ||
                             std::string(e.what()).find(": locked by a process") != std::string::npos;
      if (!transient) throw;
      if (!waiting_shown) out << "waiting: " << e.what() << std::endl;
      waiting_shown = true;
    }
    if (r) {
      check_image(*r, o.image);
      shown.resize(r->num_images());
      int64_t decoded = 0, total = 0;
      for (int64_t i = 0; i < r->num_images(); ++i) {
        if (o.image && *o.image != i) continue;
        ++total;
        ckpt::ImageState s = r->state(i);
        std::string line = str_cat(ckpt::image_group(i), " ", ckpt::status_name(s.status));
        if (s.status == ckpt::ImageStatus::Denoising) line += str_cat(", step ", progress(r->attributes(i), s));
        if (s.status == ckpt::ImageStatus::Decoded) ++decoded;
        if (line != shown[i]) out << line << std::endl;
        shown[i] = line;
      }
      if (decoded == total) {
        out << "done: " << decoded << " of " << total << " image(s) decoded" << std::endl;
        return 0;
      }
      if (timed_out()) {
        out << "timeout after " << *o.timeout << " s: " << decoded << " of " << total << " image(s) decoded" << std::endl;
        return kExitDifferent;
      }
    } else if (timed_out()) {
      out << "timeout after " << *o.timeout << " s: " << o.file << " never became readable" << std::endl;
      return kExitDifferent;
    }
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace

std::string shorten(const std::string& text, size_t max_chars) {
  size_t chars = 0, cut = std::string::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;  // UTF-8 continuation byte
    if (chars == max_chars - 1) cut = i;
    if (++chars > max_chars) return text.substr(0, cut) + "\xE2\x80\xA6";  // "…"
  }
  return text;
}

int run_inspect(const InspectOptions& o, std::ostream& out) {
  check_options(o);
  if (o.follow) return follow(o, out);
  ckpt::CheckpointReader r = ckpt::CheckpointReader::open(o.file);
  check_image(r, o.image);
  if (!o.decode.empty()) decode_sources(o, r);  // before any output: a usage error is the only line
  if (!o.diff.empty()) {
    ckpt::CheckpointReader reference = ckpt::CheckpointReader::open(o.diff);
    return diff_checkpoints(r, reference, o.image, o.tol.value_or(0.0), out) ? 0 : kExitDifferent;
  }
  print_summary(r, o.image, out);
  if (o.stats) print_stats(r, o.image, o.step, out);
  if (!o.preview.empty() || !o.decode.empty()) return write_pictures(o, r, out);
  return 0;
}

}  // namespace fluxmpi::inspect
