#pragma once
/// FLUX.2 multi-reference editing, a mode of a FLUX.2 run (Flux2Pipeline / Flux2KleinPipeline with
/// image=[...]; docs/flux2.md "Multi-reference editing"): what the FLUX.2 family's root
/// (pipeline/flux2/root.cpp) does with --image (repeatable) or a JSON Lines "image" list. Rank 0
/// decodes and checks every reference at validation, encodes them with the FLUX.2 VAE encoder in
/// stage 1 (pipeline/flux2/references.h; the encoder freed after), and the reference tokens follow
/// the image tokens through the step loop (DenoiseSetup::references). The checkpoint keeps each
/// reference's pixels (inputs/image_<k>), their tokens (latents/image) and ids (latents/image_ids),
/// so a resumed run encodes nothing again.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "io/configs.h"
#include "io/model_dir.h"
#include "parallel/encode_memory.h"
#include "pipeline/denoise.h"
#include "pipeline/family.h"
#include "pipeline/image_job.h"
#include "pipeline/job_inputs.h"
#include "pipeline/run_config.h"

namespace fluxmpi::pipeline {

/// With --resume and no --image: the checkpoint's first image's reference images.
void fill_references_from_checkpoint(RunConfig& config, const ckpt::ImageAttributes& stored);

/// At validation (FamilyRoot::resolve): the references of the job's first prompt (its JSON Lines
/// entry's "image" list, else every --image) decoded and checked — at most the model's number, each
/// within diffusers' bounds — and the size each is encoded at (`unit` = 2 x vae_scale_factor);
/// without --height/--width the output takes the first reference's size, as diffusers does. The
/// job's inputs: mode multiref with the first image's references as a preview, or text2img.
JobInputs resolve_references(RunConfig& config, const io::ModelDir& model, int64_t unit);

/// After build_job: every image's references decoded and checked; every image of the job has as
/// many references as the first, encoded at the same sizes (the messages' shapes are the job's).
void check_job_references(JobInputs& inputs, const std::vector<ImageJob>& images, const RunConfig& config,
                          const io::ModelDir& model, int64_t unit);

/// The image's checkpoint attributes: pipeline multiref and its references.
void set_reference_attributes(ckpt::ImageAttributes& attributes, const JobInputs& inputs, size_t image);

/// The references' latent sizes (RunPlan::references).
std::vector<LatentSize> reference_latents(const JobInputs& inputs, int64_t vae_scale_factor);

/// Rank 0's encode stage for the plan: the FLUX.2 VAE encoder and its activations at the largest
/// reference (one reference at a time).
parallel::EncodeStage reference_encode_stage(const JobInputs& inputs, const io::VaeConfig& vae, bool use_quant_conv,
                                             int64_t dtype_bytes, int64_t attention_chunk_bytes);

/// Stage 1: one EncodedImage per image of the job, the reference tokens of those still to encode
/// (each distinct list of files encoded once) and, with a checkpoint, the decoded references. Loads
/// the FLUX.2 VAE encoder and frees it before returning.
std::vector<EncodedImage> encode_job_references(const PreparedRun& run, at::ScalarType dtype, at::Device device);

/// inputs/image_<k>, latents/image and latents/image_ids of one image; not flushed.
void write_references(ckpt::CheckpointWriter& writer, int64_t image, const JobInputs& inputs, const EncodedImage& encoded,
                      int64_t vae_scale_factor);
/// A resumed image's reference tokens (latents/image) in `dtype`.
Conditioning stored_references(const ckpt::CheckpointReader& reader, int64_t image, at::ScalarType dtype);

/// "mode: multiref (FLUX.2 [klein]), 2 reference images: a.png (640x480, encoded at 640x480), ..."
std::string describe_references(const JobInputs& inputs, const std::string& model_name);

}  // namespace fluxmpi::pipeline
