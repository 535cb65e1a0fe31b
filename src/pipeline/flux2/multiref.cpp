#include "pipeline/flux2/multiref.h"

#include <chrono>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "models/flux2/vae_encoder.h"
#include "pipeline/flux2/family.h"
#include "pipeline/flux2/references.h"
#include "pipeline/image_conditioning.h"
#include "pipeline/prepared_run.h"

namespace fluxmpi::pipeline {
namespace {

// Each file decoded once: its reference entry (path, decoded size, encoded size).
class ReferenceCache {
 public:
  explicit ReferenceCache(int64_t unit) : unit_(unit) {}
  ckpt::ImageAttributes::Reference get(const std::string& path, const std::string& where, size_t k) {
    auto it = seen_.find(path);
    if (it != seen_.end()) return it->second;
    const io::Image8 image = decode_input(path, where);
    check_reference_image(str_cat(where, " reference image ", k), path, image.height, image.width);
    const PixelSize size = reference_size(image.height, image.width, unit_);
    ckpt::ImageAttributes::Reference r{{path, image.height, image.width}, size.height, size.width};
    return seen_.emplace(path, r).first->second;
  }

 private:
  int64_t unit_;
  std::map<std::string, ckpt::ImageAttributes::Reference> seen_;
};

void check_count(size_t count, const std::string& where, const io::ModelDir& model) {
  const int64_t most = max_reference_images(model.flux2_kind());
  if (static_cast<int64_t>(count) > most)
    throw UsageError(str_cat(where, ": ", count, " reference images, but ", flux2_model_name(model.flux2_kind()),
                             " takes at most ", most, " (docs/flux2.md, \"Multi-reference editing\")"));
}

std::string line_where(const RunConfig& c, int64_t line) { return str_cat("prompts file '", c.prompts_file, "': line ", line); }

}  // namespace

void fill_references_from_checkpoint(RunConfig& c, const ckpt::ImageAttributes& a) {
  if (c.was_given("image") || a.references.empty()) return;
  c.images.clear();
  for (const ckpt::ImageAttributes::Reference& r : a.references) c.images.push_back(r.input.path);
  c.image = c.images.front();
}

JobInputs resolve_references(RunConfig& c, const io::ModelDir& model, int64_t unit) {
  std::vector<std::string> paths = c.images;
  std::string where = "--image";
  if (!c.prompt_inputs.empty() && !c.prompt_inputs.front().images.empty()) {
    paths = c.prompt_inputs.front().images;
    where = line_where(c, c.prompt_inputs.front().line);
  }
  JobInputs in;
  in.images.emplace_back();  // a preview for --dry-run; check_job_references sets every image
  if (paths.empty()) return in;
  check_count(paths.size(), where, model);
  ReferenceCache cache(unit);
  ImageSources& first = in.images.front();
  first.where = where;
  for (size_t k = 0; k < paths.size(); ++k) {
    first.references.push_back(cache.get(paths[k], where, k));
    in.references.push_back({first.references.back().height, first.references.back().width});
  }
  in.mode = PipelineMode::Multiref;
  // Flux2Pipeline: height = height or image_height (the first reference's, after the cap and floor).
  if (!c.height) c.height = in.references.front().height;
  if (!c.width) c.width = in.references.front().width;
  return in;
}

void check_job_references(JobInputs& in, const std::vector<ImageJob>& jobs, const RunConfig& c, const io::ModelDir& model,
                          int64_t unit) {
  ReferenceCache cache(unit);
  std::vector<ImageSources> out;
  for (const ImageJob& job : jobs) {
    ImageSources s;
    const std::string where = job.line > 0 ? line_where(c, job.line) : std::string("--image");
    s.where = where;
    if (job.images.size() != in.references.size())
      throw UsageError(str_cat(job.line > 0 ? where : str_cat("image ", job.index), ": ", job.images.size(),
                               " reference images, the job's first image has ", in.references.size(),
                               ": every image of a job has as many references (split the job)"));
    check_count(job.images.size(), where, model);
    for (size_t k = 0; k < job.images.size(); ++k) {
      const ckpt::ImageAttributes::Reference r = cache.get(job.images[k], where, k);
      if (r.height != in.references[k].height || r.width != in.references[k].width)
        throw UsageError(str_cat(where, ": reference image ", k, " '", r.input.path, "' would be encoded at ", r.width, "x",
                                 r.height, ", the job's first image's at ", in.references[k].width, "x",
                                 in.references[k].height, ": the images of one job share their references' sizes "
                                 "(split the job)"));
      s.references.push_back(r);
    }
    out.push_back(std::move(s));
  }
  in.images = std::move(out);
}

void set_reference_attributes(ckpt::ImageAttributes& a, const JobInputs& in, size_t i) {
  a.pipeline = mode_name(in.mode);
  a.references = in.images.at(i).references;
}

std::vector<LatentSize> reference_latents(const JobInputs& in, int64_t vae_scale_factor) {
  std::vector<LatentSize> out;
  for (const PixelSize& r : in.references) out.push_back({r.height / vae_scale_factor, r.width / vae_scale_factor});
  return out;
}

parallel::EncodeStage reference_encode_stage(const JobInputs& in, const io::VaeConfig& vae, bool use_quant_conv,
                                             int64_t dtype_bytes, int64_t attention_chunk_bytes) {
  parallel::EncodeStage largest;
  for (const PixelSize& r : in.references) {
    const parallel::EncodeStage s =
        parallel::vae_encode_stage(vae, use_quant_conv, r.height, r.width, dtype_bytes, attention_chunk_bytes);
    if (s.total() > largest.total()) largest = s;
  }
  // The latent BatchNorm's two statistics per patchified channel.
  largest.weight_bytes += static_cast<uint64_t>(2 * 4 * vae.latent_channels * dtype_bytes);
  return largest;
}

std::vector<EncodedImage> encode_job_references(const PreparedRun& run, at::ScalarType dtype, at::Device device) {
  std::vector<EncodedImage> out(run.images.size());
  if (!run.inputs.encodes()) return out;
  std::vector<size_t> todo;
  for (size_t i = 0; i < run.images.size(); ++i)
    if (!run.progress[i].decoded && run.progress[i].needs_encoding) todo.push_back(i);
  if (todo.empty()) return out;
  const auto t0 = std::chrono::steady_clock::now();
  const flux2::VaeEncoder encoder = flux2::load_vae_encoder(run.model->component_dir("vae"), dtype, device);
  vae::EncodeOptions options;
  options.tiling = run.stages->vae_tiling();  // diffusers' enable_tiling acts on the encoder too
  options.slicing = run.config.vae_slicing;
  const int64_t unit = 2 * encoder.config().scale_factor();
  const bool keep_pixels = !run.config.checkpoint_file().empty();
  // Nothing is drawn: the images of a prompt share one encoding of their references.
  std::map<std::vector<std::string>, std::pair<at::Tensor, std::vector<io::Image8>>> done;
  for (size_t i : todo) {
    const std::vector<ckpt::ImageAttributes::Reference>& refs = run.inputs.images[i].references;
    std::vector<std::string> paths;
    for (const auto& r : refs) paths.push_back(r.input.path);
    auto it = done.find(paths);
    if (it == done.end()) {
      if (done.size() >= 4) done.clear();  // a few recent lists: the pixels are not kept for long
      std::vector<io::Image8> images;
      for (size_t k = 0; k < paths.size(); ++k)
        images.push_back(decode_input(paths[k], str_cat(run.inputs.images[i].where, " reference image ", k)));
      const at::Tensor tokens = encode_references(images, encoder, unit, dtype, options);
      it = done.emplace(paths, std::make_pair(tokens, keep_pixels ? images : std::vector<io::Image8>())).first;
    }
    EncodedImage& e = out[i];
    e.conditioning.reference = it->second.first;
    e.conditioning.stored = it->second.first.to(at::kFloat);
    e.references = it->second.second;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info("encoded the reference images of ", todo.size(), " image(s) in ", seconds, " s (FLUX.2 VAE encoder: ",
            format_bytes(static_cast<uint64_t>(encoder.parameter_bytes())), ")");
  return out;  // the encoder goes here, before the transformer slice is loaded
}

void write_references(ckpt::CheckpointWriter& w, int64_t i, const JobInputs& in, const EncodedImage& e,
                      int64_t vae_scale_factor) {
  for (size_t k = 0; k < e.references.size(); ++k) w.write_condition(i, str_cat("inputs/image_", k), image_pixels(e.references[k]));
  if (!e.conditioning.stored.defined()) return;
  w.write_condition(i, "latents/image", e.conditioning.stored);
  w.write_condition(i, "latents/image_ids", reference_ids_of(in.references, vae_scale_factor));
}

Conditioning stored_references(const ckpt::CheckpointReader& r, int64_t i, at::ScalarType dtype) {
  Conditioning c;
  if (r.shape(i).condition_tokens > 0) c.reference = r.dataset(i, "latents/image").to(dtype).unsqueeze(0);
  return c;
}

std::string describe_references(const JobInputs& in, const std::string& model_name) {
  std::string s = str_cat("mode: multiref (", model_name, ")");
  if (in.images.empty()) return s;
  const std::vector<ckpt::ImageAttributes::Reference>& refs = in.images.front().references;
  s += str_cat(", ", refs.size(), " reference image", refs.size() == 1 ? "" : "s", ":");
  for (size_t k = 0; k < refs.size(); ++k)
    s += str_cat(k ? "," : "", " ", refs[k].input.path, " (", refs[k].input.width, "x", refs[k].input.height,
                 ", encoded at ", refs[k].width, "x", refs[k].height, ")");
  if (in.images.size() > 1) s += str_cat(" (image 0 of ", in.images.size(), ")");
  return s;
}

}  // namespace fluxmpi::pipeline
