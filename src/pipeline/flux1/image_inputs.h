#pragma once
/// Rank 0's checks of a FLUX.1 job's image inputs, inside prepare_run (docs/images.md): the mode,
/// every input file (decoded here once, so that a bad one fails before anything heavy), each image's
/// strength and schedule cut, the output size they imply and what the checkpoint records of them.
/// Pixels are not kept: the image stage decodes again.

#include <string>
#include <vector>

#include "pipeline/image_job.h"
#include "pipeline/job_inputs.h"
#include "pipeline/run_config.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/format.h"
#include "io/image_file.h"
#include "io/model_dir.h"
#include "pipeline/image_mode.h"
#include "pipeline/kontext.h"

namespace fluxmpi::pipeline {

/// With --resume: the inputs, strength, --pipeline and Kontext's --max-area / --no-auto-resize the
/// command line leaves out come from the checkpoint's first image (`unit`: 2 x vae_scale_factor).
void fill_inputs_from_checkpoint(RunConfig& config, const ckpt::ImageAttributes& stored, int64_t unit);

/// Before resolve_defaults: the mode (from `model` and the inputs of the job's first prompt, the
/// JSON Lines entry or the command line), diffusers' per-mode defaults (Fill's guidance 30), and
/// the output size: Kontext's from --max-area, the others' the first input's size floored to the
/// packing unit when --height/--width are not given (docs/images.md, "Output size").
JobInputs resolve_image_mode(RunConfig& config, const io::ModelDir& model);

/// After build_job: every image's inputs decoded and checked (UsageError: a missing file; ImageError:
/// not an image, too small), the same kinds of input as the mode for every image, each image's
/// strength and t_start for `num_inference_steps`; Kontext's reference size (one for the job).
void check_job_inputs(JobInputs& inputs, const std::vector<ImageJob>& images, const RunConfig& config,
                      const io::ModelDir& model);

/// The attributes an image records (pipeline, strength, t_start, input files and sizes).
void set_input_attributes(ckpt::ImageAttributes& attributes, const JobInputs& inputs, size_t image);

/// "mode: img2img (FLUX.1 model), image photo.png (640x480), strength 0.6: 17 of 28 steps run"
/// (the first image's inputs, and how many images have inputs of their own).
std::string describe_inputs(const JobInputs& inputs, int64_t steps);

}  // namespace fluxmpi::pipeline
