#include "pipeline/flux1/image_stage.h"

#include <chrono>
#include <map>

#include "core/log.h"
#include "core/units.h"
#include "models/common/loader.h"
#include "models/vae/vae_encoder.h"
#include "pipeline/kontext.h"

namespace fluxmpi::pipeline {

using pipeline::PipelineMode;

std::vector<EncodedImage> encode_image_inputs(const PreparedRun& run, at::ScalarType dtype, at::Device device) {
  std::vector<EncodedImage> out(run.images.size());
  const JobInputs& in = run.inputs;
  if (!in.encodes()) return out;
  std::vector<size_t> todo;
  for (size_t i = 0; i < run.images.size(); ++i)
    if (!run.progress[i].decoded && run.progress[i].needs_encoding) todo.push_back(i);
  if (todo.empty()) return out;
  const auto t0 = std::chrono::steady_clock::now();
  vae::VaeEncoder encoder = vae::load_vae_encoder(*run.model, dtype, device);
  vae::EncodeOptions options;
  options.tiling = run.stages->vae_tiling();  // diffusers' enable_tiling acts on the encoder too
  options.slicing = run.config.vae_slicing;
  const sched::Schedule full =
      sched::flux_schedule(run.model->scheduler_config(), *run.config.steps, run.geometry.tokens());
  // The images of a prompt share their files: the last few decoded are kept.
  std::map<std::string, io::Image8> recent;
  auto read = [&](const std::string& path) -> io::Image8 {
    if (path.empty()) return {};
    auto it = recent.find(path);
    if (it != recent.end()) return it->second;
    if (recent.size() >= 4) recent.clear();
    return recent.emplace(path, io::read_image(path)).first->second;
  };
  const bool keep_pixels = !run.config.checkpoint_file().empty();
  at::Tensor reference;  // Kontext: the mode needs no draw, so one reference serves the images of a file
  std::string reference_path;
  for (size_t i : todo) {
    const ImageSources& s = in.images[i];
    EncodedImage& e = out[i];
    const io::Image8 image = read(s.image.path), control = read(s.control.path);
    // The pixels stay until the checkpoint stores them; without one they are not kept.
    if (keep_pixels) {
      e.image = image;
      e.mask = s.mask.path.empty() ? io::Image8{} : stored_mask(read(s.mask.path));
      e.control = control;
    }
    if (in.mode == PipelineMode::Kontext) {
      if (reference_path != s.image.path) {
        reference = pipeline::kontext_reference(image, in.condition, encoder, dtype, options);
        reference_path = s.image.path;
      }
      e.conditioning.reference = reference;
      e.conditioning.stored = reference.to(at::kFloat);
      continue;
    }
    pipeline::ConditionInputs ci;
    ci.mode = in.mode;
    ci.image = image;
    ci.mask = read(s.mask.path);
    ci.control = control;
    ci.seed = run.images[i].seed;
    ci.t_start = s.t_start;
    e.conditioning = pipeline::condition_image(ci, encoder, run.geometry, full, dtype, options);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info("encoded the input image(s) of ", todo.size(), " image(s) in ", seconds, " s (VAE encoder: ",
            format_bytes(static_cast<uint64_t>(nn::parameter_bytes(*encoder))), ")");
  return out;  // the encoder goes here, before the transformer slice is loaded
}

void write_conditioning(ckpt::CheckpointWriter& w, int64_t i, PipelineMode mode, const EncodedImage& e) {
  auto pixels = [](const io::Image8& image) {
    at::Tensor t = pipeline::image_pixels(image);
    return image.channels == 1 ? t.squeeze(2) : t;  // inputs/mask is [h, w]
  };
  if (!e.image.pixels.empty()) w.write_condition(i, "inputs/image", pixels(e.image));
  if (!e.mask.pixels.empty()) w.write_condition(i, "inputs/mask", pixels(e.mask));
  if (!e.control.pixels.empty()) w.write_condition(i, "inputs/control_image", pixels(e.control));
  const pipeline::Conditioning& c = e.conditioning;
  if (c.stored.defined()) w.write_condition(i, "latents/image", c.stored);
  if (mode == PipelineMode::Inpaint) {
    w.write_condition(i, "latents/noise", c.noise);
    w.write_condition(i, "latents/mask", c.mask);
  }
}

pipeline::Conditioning stored_conditioning(const ckpt::CheckpointReader& r, int64_t i, PipelineMode mode,
                                           at::ScalarType dtype) {
  pipeline::Conditioning c;
  auto read = [&](const char* name) { return r.dataset(i, name).to(dtype).unsqueeze(0); };
  switch (mode) {
    case PipelineMode::Fill:
    case PipelineMode::Control:
      c.features = read("latents/image");
      break;
    case PipelineMode::Kontext:
      if (r.shape(i).condition_tokens > 0) c.reference = read("latents/image");
      break;
    case PipelineMode::Inpaint:
      c.image_latents = read("latents/image");
      c.noise = read("latents/noise");
      c.mask = read("latents/mask");
      break;
    default:
      break;
  }
  return c;
}

}  // namespace fluxmpi::pipeline
