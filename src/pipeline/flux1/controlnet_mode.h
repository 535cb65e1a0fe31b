#pragma once
/// FLUX.1's ControlNet mode (FluxControlNetPipeline; docs/controlnet.md) as world rank 0 validates,
/// encodes and stores it: the ControlNets and their control images resolved and decoded before
/// anything heavy, the output size they imply, what the checkpoint records, the control images'
/// latents (or pixels) per image, and the planner's and the run plan's ControlNet fields.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "io/model_dir.h"
#include "parallel/partition.h"
#include "pipeline/controlnet_options.h"
#include "pipeline/family.h"
#include "pipeline/job_inputs.h"
#include "pipeline/prepared_run.h"
#include "pipeline/run_config.h"
#include "pipeline/run_plan.h"

namespace fluxmpi::pipeline {

/// With --resume: the ControlNet flags the command line leaves out come from the checkpoint's first
/// image (its `controlnets` attribute). --control-image files given with --resume alone are the
/// ControlNets' when the checkpoint has some, else a Control model's one (UsageError for several).
void fill_controlnets_from_checkpoint(RunConfig& config, const ckpt::ImageAttributes& stored);

/// In resolve, for a ControlNet job: the nets and runs (controlnet_options.h: UsageError,
/// ConfigError), every control image decoded once (ImageError naming it), and without
/// --height/--width the output size of the first control image floored to the packing unit.
ControlNetSetup resolve_controlnet_job(RunConfig& config, const io::ModelDir& model, JobInputs& inputs);

/// The checkpoint attribute `controlnets` of an image.
void set_controlnet_attributes(ckpt::ImageAttributes& attributes, const ControlNetSetup& setup, const JobInputs& inputs);

/// "ControlNets: 2 runs: union (Union, mode 2) on edges.png (64x64), scale 0.8, steps 0-100 %; ..."
std::string describe_controlnets(const ControlNetSetup& setup, const JobInputs& inputs);

/// The planner's ControlNet request.
parallel::ControlNetRequest controlnet_request(const ControlNetSetup& setup);

/// The run plan's ControlNet fields (`guidance`: the pipeline's guidance_scale).
void controlnet_plan(const ControlNetSetup& setup, double guidance, RunPlan& plan);

/// The image stage of a ControlNet job: per image still to encode, each control image's VAE sample
/// (its own generator, the runs in order, then the noise) or pixels; the VAE encoder loaded only
/// for the latent layouts, and freed.
std::vector<EncodedImage> encode_controlnet_images(const PreparedRun& run, at::ScalarType dtype, at::Device device);

/// inputs/controlnet_image_<k> and latents/controlnet of an image; not flushed.
void write_controlnet_conditioning(ckpt::CheckpointWriter& writer, int64_t image, const EncodedImage& encoded);

/// A resumed image's control inputs as stored: the latents, or the stored pixels preprocessed again.
Conditioning stored_controlnet_conditioning(const ckpt::CheckpointReader& checkpoint, int64_t image,
                                            const PreparedRun& run, at::ScalarType dtype);

}  // namespace fluxmpi::pipeline
