#include "pipeline/flux1/image_inputs.h"

#include <ATen/ATen.h>

#include <map>

#include "core/error.h"
#include "core/log.h"

namespace fluxmpi::pipeline {

using pipeline::PipelineMode;

void fill_inputs_from_checkpoint(RunConfig& c, const ckpt::ImageAttributes& a, int64_t unit) {
  if (!c.was_given("image")) c.image = a.image.path;
  if (!c.was_given("mask")) c.mask = a.mask.path;
  if (!c.was_given("control-image")) c.control_image = a.control_image.path;
  const auto mode = pipeline::parse_mode_name(a.pipeline);
  if (!c.was_given("strength") && mode && pipeline::uses_strength(*mode)) c.strength = a.strength;
  // A Kontext job on a plain FLUX.1 file needed --pipeline; the checkpoint remembers the mode.
  if (!c.was_given("pipeline") && mode == PipelineMode::Kontext) c.pipeline = "kontext";
  // Kontext's size follows the area: the stored output's area gives the stored output back.
  if (!c.was_given("max-area") && mode == PipelineMode::Kontext) c.max_area = a.height * a.width;
  // --no-auto-resize shows in the reference size: the image's own size floored, not the preferred one.
  if (!c.was_given("no-auto-resize") && mode == PipelineMode::Kontext && a.condition_height > 0) {
    const pipeline::PixelSize preferred = pipeline::kontext_condition_size(a.image.height, a.image.width, true, unit);
    c.no_auto_resize = preferred.height != a.condition_height || preferred.width != a.condition_width;
  }
}

namespace {

ckpt::ImageAttributes::Input input_of(const std::string& path, const io::Image8& image) {
  return {path, image.height, image.width};
}

// Each file decoded once per call site: the sizes of the files seen.
class SizeCache {
 public:
  ckpt::ImageAttributes::Input get(const std::string& path, const std::string& where) {
    if (path.empty()) return {};
    auto it = sizes_.find(path);
    if (it == sizes_.end()) it = sizes_.emplace(path, input_of(path, decode_input(path, where))).first;
    return it->second;
  }

 private:
  std::map<std::string, ckpt::ImageAttributes::Input> sizes_;
};

double default_strength(PipelineMode mode) { return mode == PipelineMode::Fill ? 1.0 : 0.6; }

// The option a first-prompt input came from, for messages.
std::string first_where(const RunConfig& c, const char* option) {
  if (!c.prompt_inputs.empty()) return str_cat("prompts file '", c.prompts_file, "': line ", c.prompt_inputs.front().line, ":");
  return option;
}

}  // namespace

JobInputs resolve_image_mode(RunConfig& c, const io::ModelDir& dir) {
  // The first prompt's inputs decide the mode: its JSON Lines entry, else the command line.
  std::string image = c.image, mask = c.mask, control = c.control_image;
  if (!c.prompt_inputs.empty()) {
    const PromptInputs& e = c.prompt_inputs.front();
    if (!e.image.empty()) image = e.image;
    if (!e.mask.empty()) mask = e.mask;
    if (!e.control_image.empty()) control = e.control_image;
  }
  const io::TransformerConfig& tc = dir.transformer_config();
  pipeline::ModeRequest request;
  request.pipeline_class = dir.pipeline_class();
  request.in_channels = tc.in_channels;
  request.out_channels = tc.out_channels;
  request.pipeline_option = c.pipeline;
  request.image = !image.empty();
  request.mask = !mask.empty();
  request.control_image = !control.empty();
  request.controlnet = !c.controlnets.empty();
  const pipeline::ResolvedMode resolved = pipeline::resolve_mode(request);
  JobInputs in;
  in.kind = resolved.kind;
  in.mode = resolved.mode;
  bool strength_given = c.strength.has_value();
  for (const PromptInputs& e : c.prompt_inputs) strength_given = strength_given || e.strength.has_value();
  if (!pipeline::uses_strength(in.mode) && strength_given)
    throw UsageError(str_cat("--strength: a ", pipeline::mode_name(in.mode),
                             " job has no strength (it applies to img2img, inpaint and Fill)"));
  if (in.mode != PipelineMode::Kontext) {
    if (c.was_given("max-area")) throw UsageError(str_cat("--max-area: only Kontext jobs choose their size by area; this is a ",
                                                          pipeline::mode_name(in.mode), " job"));
    if (c.no_auto_resize) throw UsageError(str_cat("--no-auto-resize: only Kontext jobs resize their image to a preferred "
                                                   "resolution; this is a ", pipeline::mode_name(in.mode), " job"));
  }
  // diffusers' defaults: FluxFillPipeline guidance_scale 30. (FluxKontextPipeline's is 3.5, the
  // FLUX.1 default: the model card's 2.5 is not what diffusers runs.)
  if (!c.guidance && in.mode == PipelineMode::Fill) c.guidance = 30.0;

  const int64_t unit = 2 * dir.vae_config().scale_factor();
  ImageSources first;
  first.where = first_where(c, "--image");
  if (!image.empty()) first.image = input_of(image, decode_input(image, first_where(c, "--image")));
  if (!mask.empty()) first.mask = input_of(mask, decode_input(mask, first_where(c, "--mask")));
  if (!control.empty()) first.control = input_of(control, decode_input(control, first_where(c, "--control-image")));
  first.strength = pipeline::uses_strength(in.mode)
                       ? (!c.prompt_inputs.empty() && c.prompt_inputs.front().strength ? *c.prompt_inputs.front().strength
                                                                                         : c.strength.value_or(default_strength(in.mode)))
                       : 1.0;
  if (in.mode == PipelineMode::Kontext) {
    // The output's size follows --max-area and the requested aspect, as FluxKontextPipeline sets it.
    const int64_t area = c.max_area.value_or(1024 * 1024);
    const pipeline::PixelSize out = pipeline::kontext_output_size(c.height, c.width, area, unit);
    if (out.height == 0 || out.width == 0)
      throw UsageError(str_cat("--max-area ", area, ": the Kontext output would be ", out.width, "x", out.height,
                               " pixels; give a larger area"));
    if ((c.height && *c.height != out.height) || (c.width && *c.width != out.width))
      log::info("Kontext: --max-area ", area, " makes the output ", out.width, "x", out.height,
                " (width x height), as FluxKontextPipeline does");
    c.height = out.height;
    c.width = out.width;
    if (!first.image.path.empty()) {
      in.condition = pipeline::kontext_condition_size(first.image.height, first.image.width, !c.no_auto_resize, unit);
      if (in.condition.height == 0 || in.condition.width == 0)
        throw ImageError(str_cat("'", image, "': ", first.image.width, "x", first.image.height,
                                 " pixels; a Kontext image must be at least ", unit, "x", unit));
    }
  } else {
    // Without --height/--width the output takes the input's size, floored to the packing unit.
    const ckpt::ImageAttributes::Input& sized = !first.image.path.empty() ? first.image : first.control;
    if (!sized.path.empty()) {
      if (sized.height < unit || sized.width < unit)
        throw ImageError(str_cat("'", sized.path, "': ", sized.width, "x", sized.height,
                                 " pixels; an input must be at least ", unit, "x", unit, " (the model packs ", unit,
                                 "-pixel cells)"));
      if (!c.height) c.height = sized.height / unit * unit;
      if (!c.width) c.width = sized.width / unit * unit;
    }
  }
  in.images.push_back(first);  // a preview for --dry-run; check_job_inputs sets every image
  return in;
}

void check_job_inputs(JobInputs& in, const std::vector<ImageJob>& jobs, const RunConfig& c, const io::ModelDir& dir) {
  const bool image = !in.images.front().image.path.empty(), mask = !in.images.front().mask.path.empty(),
             control = !in.images.front().control.path.empty();
  const int64_t unit = 2 * dir.vae_config().scale_factor();
  SizeCache sizes;
  std::vector<ImageSources> out;
  for (const ImageJob& job : jobs) {
    ImageSources s;
    s.where = job.line > 0 ? str_cat("prompts file '", c.prompts_file, "': line ", job.line, ":") : std::string();
    auto where = [&](const char* option) { return job.line > 0 ? s.where : std::string(option); };
    // Every image runs the job's mode: the same kinds of input as the first.
    auto same = [&](bool has, bool first_has, const char* what) {
      if (has == first_has) return;
      throw UsageError(str_cat(job.line > 0 ? s.where : str_cat("image ", job.index, ":"), " ", has ? "has" : "has no", " ",
                               what, " but the job's first image ", first_has ? "has one" : "has none",
                               ": every image of a job runs the same mode (", pipeline::mode_name(in.mode), ")"));
    };
    same(!job.image.empty(), image, "--image");
    same(!job.mask.empty(), mask, "--mask");
    same(!job.control_image.empty(), control, "--control-image");
    s.image = sizes.get(job.image, where("--image"));
    s.mask = sizes.get(job.mask, where("--mask"));
    s.control = sizes.get(job.control_image, where("--control-image"));
    for (const auto* input : {&s.image, &s.control})
      if (!input->path.empty() && (input->height < unit || input->width < unit))
        throw ImageError(str_cat(s.where.empty() ? "" : s.where + " ", "'", input->path, "': ", input->width, "x",
                                 input->height, " pixels; an input must be at least ", unit, "x", unit));
    if (pipeline::uses_strength(in.mode)) {
      s.strength = job.strength ? *job.strength : c.strength.value_or(default_strength(in.mode));
      s.t_start = pipeline::strength_start_step(*c.steps, s.strength);
    }
    if (in.mode == PipelineMode::Kontext && !s.image.path.empty()) {
      const pipeline::PixelSize cond =
          pipeline::kontext_condition_size(s.image.height, s.image.width, !c.no_auto_resize, unit);
      if (cond.height != in.condition.height || cond.width != in.condition.width)
        throw UsageError(str_cat(where("--image"), " '", s.image.path, "' would be encoded at ", cond.width, "x", cond.height,
                                 ", the job's first image at ", in.condition.width, "x", in.condition.height,
                                 ": the images of one Kontext job share their reference size (split the job)"));
    }
    out.push_back(std::move(s));
  }
  in.images = std::move(out);
}

void set_input_attributes(ckpt::ImageAttributes& a, const JobInputs& in, size_t i) {
  const ImageSources& s = in.images.at(i);
  a.pipeline = pipeline::mode_name(in.mode);
  a.family = "flux1";
  a.strength = s.strength;
  a.t_start = s.t_start;
  a.image = s.image;
  a.mask = s.mask;
  a.control_image = s.control;
  a.condition_height = s.image.path.empty() ? 0 : in.condition.height;
  a.condition_width = s.image.path.empty() ? 0 : in.condition.width;
}

std::string describe_inputs(const JobInputs& in, int64_t steps) {
  std::string s = str_cat("mode: ", pipeline::mode_name(in.mode), " (", pipeline::kind_name(in.kind), " model)");
  if (in.images.empty()) return s + "\n";
  const ImageSources& first = in.images.front();
  auto file = [](const ckpt::ImageAttributes::Input& f) { return str_cat(f.path, " (", f.width, "x", f.height, ")"); };
  if (!first.image.path.empty()) s += str_cat(", image ", file(first.image));
  if (!first.mask.path.empty()) s += str_cat(", mask ", file(first.mask));
  if (!first.control.path.empty()) s += str_cat(", control image ", file(first.control));
  if (in.condition.height > 0) s += str_cat(", encoded at ", in.condition.width, "x", in.condition.height);
  if (pipeline::uses_strength(in.mode))
    s += str_cat(", strength ", first.strength, ": ", steps - pipeline::strength_start_step(steps, first.strength), " of ",
                 steps, " steps run");
  if (in.images.size() > 1) s += str_cat(" (image 0 of ", in.images.size(), ")");
  return s + "\n";
}

}  // namespace fluxmpi::pipeline
