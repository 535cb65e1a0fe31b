#pragma once
// The checks of fluxmpi's options by group, from raw values (app/option_settings.h) to the fields
// of RunConfig: files and folders exist, paths made absolute, values within their ranges, prompts
// read. Internal to the options: not part of the library's interface.

#include <string>

#include "app/option_settings.h"
#include "pipeline/run_config.h"

namespace fluxmpi::app::options {

/// --dtype in its short spelling ("auto", "fp32", "bf16", "fp16").
std::string normalise_dtype(const Settings& s);
/// --model and the single-file components (--transformer, --vae, --text-encoder(-2), --model-config).
void check_model(const Settings& s, RunConfig& c);
/// --image, --mask, --control-image (absolute), --strength, --max-area, --no-auto-resize, --pipeline.
void check_image_inputs(const Settings& s, RunConfig& c);
/// --controlnet folders, --control-image (one, or the ControlNets' images), --control-mode,
/// --controlnet-scale, --control-guidance-start/-end; the ControlNet flags need --controlnet.
void check_controlnets(const Settings& s, RunConfig& c);
/// --lora FILE[:SCALE], each file present, absolute.
void check_loras(const Settings& s, RunConfig& c);
/// FLUX.1 Redux: the folder, the images (absolute paths) and the scales; the Redux options need
/// --redux-model and it needs an image. The files' contents are read by prepare_run.
void check_redux(const Settings& s, RunConfig& c);
/// --prompt / --prompts-file (read here), --prompt-2, --negative-prompt.
void check_prompts(const Settings& s, RunConfig& c);
/// -o, --checkpoint and --resume: writable folders, no file overwritten.
void check_output_and_checkpoints(const Settings& s, RunConfig& c);

}  // namespace fluxmpi::app::options
