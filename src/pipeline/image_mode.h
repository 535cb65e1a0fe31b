#pragma once
/// Which FLUX.1 pipeline of diffusers a job runs, from the model and the images it is given
/// (docs/images.md, "Modes"):
///
///   text2img  FluxPipeline                       no image
///   img2img   FluxImg2ImgPipeline                --image on a FLUX.1 model (in_channels 64)
///   inpaint   FluxInpaintPipeline                --image and --mask on a FLUX.1 model
///   fill      FluxFillPipeline                   --image and --mask on a Fill model (in_channels 384)
///   control   FluxControlPipeline                --control-image on a Canny/Depth model (in_channels 128)
///   kontext   FluxKontextPipeline                [--image] on a Kontext model (shapes of FLUX.1-dev)
///   controlnet FluxControlNetPipeline            --controlnet DIR and --control-image on a FLUX.1 model
///   multiref  Flux2Pipeline, Flux2KleinPipeline  --image (repeatable) on a FLUX.2 model (docs/flux2.md;
///             pipeline/flux2/multiref.h: not resolved here)
///
/// The model's kind comes from model_index.json's _class_name, else from the transformer's
/// in_channels, else from --pipeline (a Kontext single file has FLUX.1-dev's shapes).

#include <cstdint>
#include <optional>
#include <string>

#include "sched/flow_match_euler.h"

namespace fluxmpi::pipeline {

enum class PipelineMode { Text2Img, Img2Img, Inpaint, Fill, Control, Kontext, ControlNet, Multiref };

/// The checkpoint's `pipeline` attribute: "text2img", "img2img", "inpaint", "fill", "control", "kontext",
/// "controlnet", "multiref".
const char* mode_name(PipelineMode mode);
/// The inverse of mode_name; nullopt for another text.
std::optional<PipelineMode> parse_mode_name(const std::string& name);

/// What a model can run: a FLUX.1 text-to-image model runs text2img, img2img and inpaint.
enum class ModelKind { Base, Fill, Control, Kontext };
const char* kind_name(ModelKind kind);  ///< "FLUX.1", "FLUX.1 Fill", "FLUX.1 Control", "FLUX.1 Kontext"

/// What the run was given, for resolve_mode.
struct ModeRequest {
  std::string pipeline_class;   ///< model_index.json's _class_name
  int64_t in_channels = 64;     ///< the transformer's
  int64_t out_channels = 64;
  std::string pipeline_option;  ///< --pipeline NAME, empty when not given
  bool image = false, mask = false, control_image = false;
  bool controlnet = false;  ///< --controlnet (FluxControlNetPipeline on a FLUX.1 model)
};

/// The model's kind and the job's mode. Throws UsageError (a contradiction between the folder, the
/// transformer and --pipeline, or inputs the mode cannot take), naming both sides.
struct ResolvedMode {
  ModelKind kind = ModelKind::Base;
  PipelineMode mode = PipelineMode::Text2Img;
};
ResolvedMode resolve_mode(const ModeRequest& request);

/// Whether the mode starts from the encoded image part-way through the schedule (--strength).
inline bool uses_strength(PipelineMode mode) {
  return mode == PipelineMode::Img2Img || mode == PipelineMode::Inpaint || mode == PipelineMode::Fill;
}

/// diffusers' get_timesteps: t_start = int(N - min(N * strength, N)), in float64 (a truncation:
/// N 4, strength 0.6 -> 1, so 3 steps run). 0 < strength <= 1.
int64_t strength_start_step(int64_t num_inference_steps, double strength);

/// The schedule actually run from step t_start: timesteps[t_start:], sigmas[t_start:].
sched::Schedule cut_schedule(const sched::Schedule& full, int64_t t_start);

}  // namespace fluxmpi::pipeline
