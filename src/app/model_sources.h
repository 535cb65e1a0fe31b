#pragma once
/// From the options to the model's sources: which folder or file each component's weights come
/// from, and where the shipped FLUX.1-dev / FLUX.1-schnell configs are.

#include <string>

#include "pipeline/run_config.h"
#include "io/model_dir.h"

namespace fluxmpi::app {

using pipeline::RunConfig;

/// The folder with the shipped configs and tokenizers (FLUX.1-dev/, FLUX.1-schnell/): next to the
/// executable in an installed tree (<prefix>/bin/fluxmpi -> <prefix>/share/fluxmpi/models), else
/// the source tree's share/fluxmpi/models (a build tree). The first that exists; the installed
/// path when neither does (the error then names it).
std::string shipped_models_dir();

/// --model, --transformer, --vae, --text-encoder, --text-encoder-2, --model-config as sources.
io::ModelSources model_sources_of(const RunConfig& config);

}  // namespace fluxmpi::app
