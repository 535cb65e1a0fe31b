#pragma once
/// FLUX.1's image stage on rank 0 (docs/images.md): after the prompts are encoded and before the
/// transformer slice is loaded, the VAE encoder turns every input image into the conditioning of its
/// image, then is freed. The checkpoint keeps what a resumed run needs, so resuming encodes nothing again.

#include <ATen/ATen.h>

#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "pipeline/family.h"
#include "pipeline/image_conditioning.h"
#include "pipeline/prepared_run.h"

namespace fluxmpi::pipeline {

/// One EncodedImage per image of the job: computed for the images still to encode (empty for the
/// others and for modes without inputs). Decodes each input file again (each distinct file once in
/// a row), loads the VAE encoder, frees it.
std::vector<EncodedImage> encode_image_inputs(const PreparedRun& run, at::ScalarType dtype, at::Device device);

/// Writes an image's inputs (inputs/*) and conditioning (latents/image, inpaint's latents/noise and
/// latents/mask) into the checkpoint; not flushed (the Denoising status that follows flushes).
void write_conditioning(ckpt::CheckpointWriter& writer, int64_t image, pipeline::PipelineMode mode,
                        const EncodedImage& encoded);

/// A resumed image's conditioning as the checkpoint stores it, in `dtype` (initial stays undefined).
pipeline::Conditioning stored_conditioning(const ckpt::CheckpointReader& checkpoint, int64_t image,
                                           pipeline::PipelineMode mode, at::ScalarType dtype);

}  // namespace fluxmpi::pipeline
