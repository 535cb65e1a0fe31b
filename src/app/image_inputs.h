#pragma once
/// Rank 0's checks of a job's image inputs, inside prepare_run (docs/images.md): the mode, every
/// input file (decoded here once, so that a bad one fails before anything heavy), each image's
/// strength and schedule cut, the output size they imply, what the checkpoint records of them, and
/// on --resume that the files did not change. Pixels are not kept: the image stage decodes again.

#include <string>
#include <vector>

#include "app/job.h"
#include "app/run_config.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/format.h"
#include "io/image_file.h"
#include "io/model_dir.h"
#include "pipeline/image_mode.h"
#include "pipeline/kontext.h"

namespace fluxmpi::app {

/// The inputs of one image of the job.
struct ImageSources {
  ckpt::ImageAttributes::Input image, mask, control;  ///< paths and decoded sizes (path empty: none)
  double strength = 1.0;  ///< the effective strength (1 where the mode has none)
  int64_t t_start = 0;    ///< steps of the full schedule skipped
  std::string where;      ///< "--image" or "prompts file 'p.jsonl': line 3", for messages
};

struct JobInputs {
  pipeline::ModelKind kind = pipeline::ModelKind::Base;
  pipeline::PipelineMode mode = pipeline::PipelineMode::Text2Img;
  std::vector<ImageSources> images;  ///< one per image of the job (empty for a dry run)
  pipeline::PixelSize condition;     ///< Kontext with an image: the reference's encoded size (all images)

  /// Whether the job runs the VAE encoder (text2img and Kontext without an image do not).
  bool encodes() const;
};

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

/// --resume: every input the checkpoint stores must decode to its stored pixels (CheckpointError
/// naming the file otherwise: "input image '<path>' has changed since the checkpoint was written").
void check_unchanged_inputs(const ckpt::CheckpointReader& checkpoint, const JobInputs& inputs);

/// "mode: img2img (FLUX.1 model), image photo.png (640x480), strength 0.6: 17 of 28 steps run"
/// (the first image's inputs, and how many images have inputs of their own).
std::string describe_inputs(const JobInputs& inputs, int64_t steps);

/// The mask as the checkpoint stores it ([h, w] grey).
io::Image8 stored_mask(const io::Image8& mask);

}  // namespace fluxmpi::app
