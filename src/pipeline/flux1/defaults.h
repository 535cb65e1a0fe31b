#pragma once
/// FLUX.1's model-dependent defaults of a run (DESIGN.md §7), deliberately friendlier than
/// diffusers', which are the same for every model.

#include "io/model_dir.h"
#include "pipeline/run_config.h"

namespace fluxmpi::pipeline {

/// Fills every option left unset from the model's configs:
///   schnell (no guidance embedding): 4 steps, max_sequence_length 256, guidance 0 (a given
///     --guidance is accepted and ignored, with a note, as diffusers ignores guidance_scale);
///   dev: 28 steps, guidance 3.5, max_sequence_length 512;
///   both: 1024 x 1024.
/// Then floors height and width to multiples of 2 * vae_scale_factor as diffusers does, with a
/// warning stating the new size; a size that floors to 0 is a UsageError. Reads the transformer
/// and VAE configs (ConfigError when they are bad).
void resolve_defaults(RunConfig& config, const io::ModelDir& model);

}  // namespace fluxmpi::pipeline
