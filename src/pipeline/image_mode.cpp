#include "pipeline/image_mode.h"

#include <cmath>
#include <utility>

#include "core/error.h"

namespace fluxmpi::pipeline {
namespace {

constexpr std::pair<PipelineMode, const char*> kModeNames[] = {
    {PipelineMode::Text2Img, "text2img"}, {PipelineMode::Img2Img, "img2img"}, {PipelineMode::Inpaint, "inpaint"},
    {PipelineMode::Fill, "fill"},         {PipelineMode::Control, "control"}, {PipelineMode::Kontext, "kontext"},
    {PipelineMode::ControlNet, "controlnet"},
    {PipelineMode::Multiref, "multiref"},
};

// A diffusers class name or a --pipeline name: the model kind it needs and, for the img2img and
// inpaint pipelines, the inputs it needs.
struct PipelineName {
  const char* class_name;
  const char* short_name;
  ModelKind kind;
  bool needs_image, needs_mask;
};
constexpr PipelineName kPipelines[] = {
    {"FluxPipeline", "text2img", ModelKind::Base, false, false},
    {"FluxImg2ImgPipeline", "img2img", ModelKind::Base, true, false},
    {"FluxInpaintPipeline", "inpaint", ModelKind::Base, true, true},
    {"FluxFillPipeline", "fill", ModelKind::Fill, true, true},
    {"FluxControlPipeline", "control", ModelKind::Control, false, false},
    {"FluxKontextPipeline", "kontext", ModelKind::Kontext, false, false},
};

const PipelineName* find_pipeline(const std::string& name) {
  for (const PipelineName& p : kPipelines)
    if (name == p.class_name || name == p.short_name) return &p;
  return nullptr;
}

// The kind the transformer's channels imply (Base also for Kontext, whose shapes are FLUX.1-dev's).
ModelKind kind_of_channels(int64_t in, int64_t out) {
  if (in == 6 * out) return ModelKind::Fill;
  if (in == 2 * out) return ModelKind::Control;
  return ModelKind::Base;
}

std::string channels_text(const ModeRequest& r) { return str_cat("the transformer's in_channels is ", r.in_channels); }

void require_inputs(const PipelineName& p, const ModeRequest& r, const std::string& who) {
  if (p.needs_image && !r.image) throw UsageError(str_cat(who, " needs --image FILE"));
  if (p.needs_mask && !r.mask) throw UsageError(str_cat(who, " needs --mask FILE"));
}

}  // namespace

const char* mode_name(PipelineMode mode) {
  for (const auto& [m, name] : kModeNames)
    if (m == mode) return name;
  return "?";
}

std::optional<PipelineMode> parse_mode_name(const std::string& name) {
  for (const auto& [m, text] : kModeNames)
    if (name == text) return m;
  return std::nullopt;
}

const char* kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::Base: return "FLUX.1";
    case ModelKind::Fill: return "FLUX.1 Fill";
    case ModelKind::Control: return "FLUX.1 Control";
    case ModelKind::Kontext: return "FLUX.1 Kontext";
  }
  return "?";
}

ResolvedMode resolve_mode(const ModeRequest& r) {
  const PipelineName* folder = find_pipeline(r.pipeline_class);
  if (folder == nullptr) throw InternalError(str_cat("unknown pipeline class '", r.pipeline_class, "'"));
  const ModelKind by_channels = kind_of_channels(r.in_channels, r.out_channels);
  const std::string folder_text = str_cat("model_index.json says ", folder->class_name);
  // Folder against channels. Kontext has FLUX.1-dev's shapes; FluxPipeline (also the class of the
  // shipped configs a single file is read with) leaves the kind to the channels.
  const bool folder_names_kind = folder->kind != ModelKind::Base;
  const ModelKind folder_channels = folder->kind == ModelKind::Kontext ? ModelKind::Base : folder->kind;
  if ((folder_names_kind || std::string(folder->class_name) != "FluxPipeline") && by_channels != folder_channels)
    throw UsageError(str_cat(folder_text, " (a ", kind_name(folder->kind), " model) but ", channels_text(r), " (a ",
                             kind_name(by_channels), " model)"));
  ModelKind kind = folder_names_kind ? folder->kind : by_channels;
  const bool known = folder_names_kind || by_channels != ModelKind::Base;
  if (!r.pipeline_option.empty()) {
    const PipelineName* named = find_pipeline(r.pipeline_option);
    if (named == nullptr)
      throw UsageError(str_cat("--pipeline '", r.pipeline_option,
                               "': expected text2img, img2img, inpaint, fill, control or kontext (or a diffusers "
                               "class name such as FluxKontextPipeline)"));
    // Only a plain FLUX.1 model can be told it is Kontext: every other kind shows itself.
    if (named->kind != kind && (known || named->kind != ModelKind::Kontext))
      throw UsageError(str_cat("--pipeline ", r.pipeline_option, " needs a ", kind_name(named->kind), " model, but ",
                               folder_names_kind ? folder_text : channels_text(r), " (a ", kind_name(kind), " model)"));
    kind = named->kind;
    require_inputs(*named, r, str_cat("--pipeline ", r.pipeline_option));
  }
  require_inputs(*folder, r, str_cat("a ", folder->class_name, " model folder"));

  ResolvedMode out;
  out.kind = kind;
  const std::string model = str_cat("a ", kind_name(kind), " model");
  if (r.controlnet) {
    // FluxControlNetPipeline: a FLUX.1 text-to-image transformer with ControlNets beside it.
    if (kind != ModelKind::Base || (!r.pipeline_option.empty() && find_pipeline(r.pipeline_option)->kind != ModelKind::Base))
      throw UsageError(str_cat("--controlnet needs a FLUX.1 text-to-image model (FluxControlNetPipeline); this is ", model));
    if (r.image || r.mask)
      throw UsageError(str_cat(r.image ? "--image" : "--mask", ": --controlnet runs text-to-image with control images "
                               "(FluxControlNetPipeline); give the ControlNets' images with --control-image"));
    out.mode = PipelineMode::ControlNet;
    return out;
  }
  switch (kind) {
    case ModelKind::Base:
      if (r.control_image)
        throw UsageError(str_cat("--control-image needs a FLUX.1 Control model (FluxControlPipeline, in_channels ",
                                 2 * r.out_channels, "); ", channels_text(r)));
      if (r.mask && !r.image) throw UsageError("--mask needs --image (the image to inpaint)");
      out.mode = r.mask ? PipelineMode::Inpaint : r.image ? PipelineMode::Img2Img : PipelineMode::Text2Img;
      break;
    case ModelKind::Fill:
      if (r.control_image) throw UsageError(str_cat("--control-image: ", model, " takes --image and --mask"));
      if (!r.image || !r.mask)
        throw UsageError(str_cat(model, " (FluxFillPipeline) needs --image and --mask (white = the part to fill)"));
      out.mode = PipelineMode::Fill;
      break;
    case ModelKind::Control:
      if (r.image || r.mask)
        throw UsageError(str_cat(r.image ? "--image" : "--mask", ": ", model,
                                 " takes --control-image FILE (an edge or depth map), not --image or --mask"));
      if (!r.control_image) throw UsageError(str_cat(model, " (FluxControlPipeline) needs --control-image FILE"));
      out.mode = PipelineMode::Control;
      break;
    case ModelKind::Kontext:
      if (r.mask) throw UsageError(str_cat("--mask: ", model, " takes --image only (the image to edit)"));
      if (r.control_image) throw UsageError(str_cat("--control-image: ", model, " takes --image only"));
      out.mode = PipelineMode::Kontext;
      break;
  }
  return out;
}

int64_t strength_start_step(int64_t n, double strength) {
  FLUX_CHECK(strength > 0 && strength <= 1, "strength ", strength);
  const double init = std::min(static_cast<double>(n) * strength, static_cast<double>(n));
  return static_cast<int64_t>(std::max(static_cast<double>(n) - init, 0.0));
}

sched::Schedule cut_schedule(const sched::Schedule& full, int64_t t_start) {
  FLUX_CHECK(t_start >= 0 && t_start < full.num_steps(), "t_start ", t_start, " of ", full.num_steps(), " steps");
  sched::Schedule s = full;
  s.timesteps.erase(s.timesteps.begin(), s.timesteps.begin() + t_start);
  s.sigmas.erase(s.sigmas.begin(), s.sigmas.begin() + t_start);
  return s;
}

}  // namespace fluxmpi::pipeline
