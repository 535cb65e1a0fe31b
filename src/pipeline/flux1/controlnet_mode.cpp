#include "pipeline/flux1/controlnet_mode.h"

#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "models/common/loader.h"
#include "models/vae/vae_encoder.h"
#include "pipeline/controlnet_inputs.h"
#include "pipeline/image_conditioning.h"

namespace fluxmpi::pipeline {

void fill_controlnets_from_checkpoint(RunConfig& c, const ckpt::ImageAttributes& a) {
  if (a.controlnets.empty()) {
    // A job without ControlNets: a --control-image given with --resume alone is a Control model's.
    if (c.controlnets.empty() && c.controlnet_images.size() > 1)
      throw UsageError(str_cat("--control-image is given ", c.controlnet_images.size(), " times: several control images "
                               "are for ControlNets (--controlnet DIR); the checkpoint's job has none"));
    if (c.controlnets.empty()) c.controlnet_images.clear();
    return;
  }
  c.control_image.clear();  // a given --control-image is a ControlNet's
  if (!c.was_given("controlnet")) {
    // One folder behind every run: one net (a Union's conditions); else one net per run.
    bool one = a.controlnets.size() > 1;
    for (const ckpt::ControlNetUse& r : a.controlnets) one = one && r.controlnet == a.controlnets.front().controlnet;
    c.controlnets.clear();
    for (const ckpt::ControlNetUse& r : a.controlnets) {
      c.controlnets.push_back(r.controlnet);
      if (one) break;
    }
  }
  if (!c.was_given("control-image")) {
    c.controlnet_images.clear();
    for (const ckpt::ControlNetUse& r : a.controlnets) c.controlnet_images.push_back(r.control_image);
  }
  auto fill = [&](const char* option, auto& out, auto field) {
    if (c.was_given(option)) return;
    out.clear();
    for (const ckpt::ControlNetUse& r : a.controlnets) out.push_back(r.*field);
  };
  fill("control-mode", c.control_modes, &ckpt::ControlNetUse::mode);
  fill("controlnet-scale", c.controlnet_scales, &ckpt::ControlNetUse::scale);
  fill("control-guidance-start", c.control_guidance_starts, &ckpt::ControlNetUse::guidance_start);
  fill("control-guidance-end", c.control_guidance_ends, &ckpt::ControlNetUse::guidance_end);
}

ControlNetSetup resolve_controlnet_job(RunConfig& c, const io::ModelDir& dir, JobInputs& in) {
  for (const PromptInputs& e : c.prompt_inputs)
    if (!e.image.empty() || !e.mask.empty() || !e.control_image.empty() || e.strength)
      throw UsageError(str_cat("prompts file '", c.prompts_file, "': line ", e.line,
                               ": image inputs of a line are not taken with --controlnet (its --control-image files "
                               "serve every image of the job)"));
  ControlNetOptions o;
  o.nets = c.controlnets;
  o.images = c.controlnet_images;
  o.modes = c.control_modes;
  o.scales = c.controlnet_scales;
  o.starts = c.control_guidance_starts;
  o.ends = c.control_guidance_ends;
  const int64_t vae_scale = dir.vae_config().scale_factor(), unit = 2 * vae_scale;
  ControlNetSetup s = resolve_controlnets(o, dir.transformer_config(), vae_scale);
  in.controlnet_images.clear();
  std::map<std::string, ckpt::ImageAttributes::Input> seen;
  for (const std::string& path : s.images) {
    auto it = seen.find(path);
    if (it == seen.end()) {
      const io::Image8 image = decode_input(path, "--control-image");
      it = seen.emplace(path, ckpt::ImageAttributes::Input{path, image.height, image.width}).first;
    }
    const ckpt::ImageAttributes::Input& i = it->second;
    if (i.height < unit || i.width < unit)
      throw ImageError(str_cat("--control-image '", path, "': ", i.width, "x", i.height,
                               " pixels; a control image must be at least ", unit, "x", unit));
    in.controlnet_images.push_back(i);
  }
  in.controlnet_pixels = s.pixels;
  // Without --height/--width the output takes the first control image's size, floored.
  const ckpt::ImageAttributes::Input& first = in.controlnet_images.front();
  if (!c.height) c.height = first.height / unit * unit;
  if (!c.width) c.width = first.width / unit * unit;
  return s;
}

void set_controlnet_attributes(ckpt::ImageAttributes& a, const ControlNetSetup& s, const JobInputs& in) {
  a.controlnets.clear();
  for (size_t k = 0; k < s.runs.size(); ++k) {
    const ControlRun& r = s.runs[k];
    const ckpt::ImageAttributes::Input& image = in.controlnet_images.at(k);
    a.controlnets.push_back(ckpt::ControlNetUse{s.nets[r.net], image.path, image.height, image.width, r.mode, r.scale,
                                                r.guidance_start, r.guidance_end, s.pixels});
  }
}

std::string describe_controlnets(const ControlNetSetup& s, const JobInputs& in) {
  std::string d = str_cat("ControlNets: ", s.nets.size(), " net", s.nets.size() == 1 ? "" : "s", ", ", s.runs.size(), " run",
                          s.runs.size() == 1 ? "" : "s", " a step:");
  for (size_t k = 0; k < s.runs.size(); ++k) {
    const ControlRun& r = s.runs[k];
    const io::ControlNetConfig& c = s.configs[r.net];
    const ckpt::ImageAttributes::Input& image = in.controlnet_images.at(k);
    d += str_cat(k ? ";" : "", " ", s.nets[r.net], " (", c.takes_pixels() ? "XLabs" : c.is_union() ? "Union" : "InstantX", ", ",
                 c.num_layers, " + ", c.num_single_layers, " blocks", c.is_union() ? str_cat(", mode ", r.mode) : "", ") on ",
                 image.path, " (", image.width, "x", image.height, "), scale ", r.scale, ", steps ",
                 100 * r.guidance_start, "-", 100 * r.guidance_end, " %");
  }
  return d + "\n";
}

parallel::ControlNetRequest controlnet_request(const ControlNetSetup& s) {
  parallel::ControlNetRequest r;
  r.nets = s.configs;
  for (const ControlRun& run : s.runs) r.runs.push_back(run.net);
  r.layout = s.layout;
  return r;
}

void controlnet_plan(const ControlNetSetup& s, double guidance, RunPlan& plan) {
  plan.controlnets = s.nets;
  plan.control_runs = s.runs;
  plan.control_layout = s.layout;
  plan.controlnet_guidance = guidance;
}

std::vector<EncodedImage> encode_controlnet_images(const PreparedRun& run, at::ScalarType dtype, at::Device device) {
  std::vector<EncodedImage> out(run.images.size());
  const JobInputs& in = run.inputs;
  std::vector<size_t> todo;
  for (size_t i = 0; i < run.images.size(); ++i)
    if (!run.progress[i].decoded && run.progress[i].needs_encoding) todo.push_back(i);
  if (todo.empty()) return out;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<io::Image8> images;
  for (const ckpt::ImageAttributes::Input& i : in.controlnet_images) images.push_back(io::read_image(i.path));
  std::optional<vae::VaeEncoder> encoder;
  if (!in.controlnet_pixels) encoder.emplace(vae::load_vae_encoder(*run.model, dtype, device));
  vae::EncodeOptions options;
  options.tiling = run.stages->vae_tiling();
  options.slicing = run.config.vae_slicing;
  const bool keep_pixels = !run.config.checkpoint_file().empty();
  for (size_t i : todo) {
    const ControlNetConditioning cn = controlnet_conditioning(images, in.controlnet_pixels, run.images[i].seed,
                                                              encoder ? &*encoder : nullptr, run.geometry, dtype, options);
    EncodedImage& e = out[i];
    e.conditioning.initial = cn.initial;
    e.conditioning.controlnet = at::stack(cn.controls, 1);
    if (!in.controlnet_pixels) e.conditioning.stored = at::cat(cn.controls, 0).to(at::kFloat);
    if (keep_pixels) e.controlnet_images = images;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info("prepared the ", images.size(), " control image(s) of ", todo.size(), " image(s) in ", std::lround(seconds * 100) / 100.0, " s",
            encoder ? str_cat(" (VAE encoder: ", format_bytes(static_cast<uint64_t>(nn::parameter_bytes(**encoder))), ")")
                    : std::string(" (pixels: no VAE encode)"));
  return out;
}

void write_controlnet_conditioning(ckpt::CheckpointWriter& w, int64_t i, const EncodedImage& e) {
  for (size_t k = 0; k < e.controlnet_images.size(); ++k)
    w.write_condition(i, str_cat("inputs/controlnet_image_", k), image_pixels(e.controlnet_images[k]));
  if (e.conditioning.stored.defined()) w.write_condition(i, "latents/controlnet", e.conditioning.stored);
}

Conditioning stored_controlnet_conditioning(const ckpt::CheckpointReader& r, int64_t i, const PreparedRun& run,
                                            at::ScalarType dtype) {
  Conditioning c;
  if (!run.inputs.controlnet_pixels) {
    c.controlnet = r.dataset(i, "latents/controlnet").to(dtype).unsqueeze(0);
    return c;
  }
  std::vector<at::Tensor> pixels;
  for (size_t k = 0; k < run.inputs.controlnet_images.size(); ++k) {
    const at::Tensor t = r.dataset(i, str_cat("inputs/controlnet_image_", k)).contiguous();
    io::Image8 image;
    image.height = t.size(0);
    image.width = t.size(1);
    image.channels = 3;
    image.pixels.assign(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
    pixels.push_back(preprocess_image(image, run.geometry).to(dtype));
  }
  c.controlnet = at::stack(pixels, 1);
  return c;
}

}  // namespace fluxmpi::pipeline
