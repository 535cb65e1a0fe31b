#pragma once
/// The image inputs of a job (docs/images.md) as rank 0's validation resolves them: per image the
/// files it was given, their decoded sizes, its strength and schedule cut; for the job its mode and
/// Kontext's reference size. The model family fills them (FLUX.1: pipeline/flux1/image_inputs.h);
/// the run's flow compares them with a resumed checkpoint.

#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/format.h"
#include "io/image_file.h"
#include "pipeline/image_mode.h"
#include "pipeline/kontext.h"

namespace fluxmpi::pipeline {

/// The inputs of one image of the job.
struct ImageSources {
  ckpt::ImageAttributes::Input image, mask, control;  ///< paths and decoded sizes (path empty: none)
  /// FLUX.2 multi-reference: every reference image (path, decoded size, encoded size), in order.
  std::vector<ckpt::ImageAttributes::Reference> references;
  double strength = 1.0;  ///< the effective strength (1 where the mode has none)
  int64_t t_start = 0;    ///< steps of the full schedule skipped
  std::string where;      ///< "--image" or "prompts file 'p.jsonl': line 3", for messages
};

struct JobInputs {
  pipeline::ModelKind kind = pipeline::ModelKind::Base;
  pipeline::PipelineMode mode = pipeline::PipelineMode::Text2Img;
  std::vector<ImageSources> images;  ///< one per image of the job (empty for a dry run)
  pipeline::PixelSize condition;     ///< Kontext with an image: the reference's encoded size (all images)
  /// ControlNets: each run's control image (the same for every image of the job) and whether the
  /// nets read its pixels (XLabs layout) rather than its VAE latents.
  std::vector<ckpt::ImageAttributes::Input> controlnet_images;
  bool controlnet_pixels = false;
  /// FLUX.2 multi-reference: the size each reference is encoded at (the same for every image).
  std::vector<pipeline::PixelSize> references;

  /// Whether the job runs the VAE encoder (text2img and Kontext without an image do not).
  bool encodes() const;
};

/// Decodes the input `path` given by `where` ("--image", or a prompts file line): UsageError for a
/// missing file, ImageError for a bad one, both naming where the path came from.
io::Image8 decode_input(const std::string& path, const std::string& where);

/// --resume: every input the checkpoint stores must decode to its stored pixels (CheckpointError
/// naming the file otherwise: "input image '<path>' has changed since the checkpoint was written").
void check_unchanged_inputs(const ckpt::CheckpointReader& checkpoint, const JobInputs& inputs);

/// The mask as the checkpoint stores it ([h, w] grey).
io::Image8 stored_mask(const io::Image8& mask);

}  // namespace fluxmpi::pipeline
