#include "pipeline/flux1/defaults.h"

#include "core/error.h"
#include "core/log.h"
#include "models/flux/latents.h"

namespace fluxmpi::pipeline {

namespace {

struct VariantDefaults {
  int64_t steps;
  int64_t max_sequence_length;
  double guidance;
};

// schnell is timestep-distilled for 1-4 steps and trained with 256 T5 tokens; dev is
// guidance-distilled and is run by its authors with 28-50 steps, guidance 3.5 and 512 tokens.
VariantDefaults defaults_of(io::Variant variant) {
  if (variant == io::Variant::Schnell) return {4, 256, 0.0};
  return {28, 512, 3.5};
}

}  // namespace

void resolve_defaults(RunConfig& config, const io::ModelDir& model) {
  const io::Variant variant = model.variant();
  const VariantDefaults d = defaults_of(variant);
  if (!config.steps) config.steps = d.steps;
  if (!config.max_sequence_length) config.max_sequence_length = d.max_sequence_length;
  if (variant == io::Variant::Schnell) {
    if (config.guidance)
      log::info("note: --guidance ", *config.guidance, " is ignored: ", model.label("transformer/config.json"),
                " has no guidance embedding (FLUX.1-schnell)");
    config.guidance = 0.0;
  } else if (!config.guidance) {
    config.guidance = d.guidance;
  }

  const int64_t requested_height = config.height.value_or(kDefaultImageSize);
  const int64_t requested_width = config.width.value_or(kDefaultImageSize);
  const int64_t scale = model.vae_config().scale_factor();
  const flux::LatentGeometry g =
      flux::latent_geometry(requested_height, requested_width, scale, model.transformer_config().latent_channels());
  const int64_t unit = 2 * scale;
  if (flux::is_empty(g)) {
    const bool height_empty = g.latent_height == 0;
    throw UsageError(str_cat(height_empty ? "--height " : "--width ", height_empty ? requested_height : requested_width,
                             " is smaller than ", unit, " (2 x the VAE scale factor ", scale, " of ",
                             model.label("vae/config.json"), "): the image would be empty"));
  }
  if (g.height != requested_height || g.width != requested_width)
    log::warn("--height and --width must be multiples of ", unit, " for this model (2 x the VAE scale factor): ",
              requested_height, "x", requested_width, " (height x width) is floored to ", g.height, "x", g.width);
  config.height = g.height;
  config.width = g.width;
}

}  // namespace fluxmpi::pipeline
