#pragma once
/// Rank 0's image stage (docs/images.md): after the prompts are encoded and before the transformer
/// slice is loaded, the VAE encoder turns every input image into the conditioning of its image, then
/// is freed. The checkpoint keeps what a resumed run needs, so resuming encodes nothing again.

#include <ATen/ATen.h>

#include <vector>

#include "pipeline/prepared_run.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "pipeline/image_conditioning.h"

namespace fluxmpi::pipeline {

/// What the image stage made of one image: its conditioning and, when the run writes a checkpoint,
/// the input pixels it stores (inputs/*).
struct EncodedImage {
  pipeline::Conditioning conditioning;
  io::Image8 image, mask, control;  ///< as decoded; the mask as stored (grey)
};

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
