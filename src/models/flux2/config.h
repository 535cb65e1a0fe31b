#pragma once
/// Flux2Transformer2DModel (diffusers) arguments: io::Flux2TransformerConfig, the struct the
/// torch-free layers (planner, checkpoint) read too, under the model's own names.

#include <string>

#include "io/flux2_configs.h"
#include "io/json_config.h"

namespace fluxmpi::flux2 {

using TransformerConfig = io::Flux2TransformerConfig;
inline constexpr const char* kTransformerClass = io::kFlux2TransformerClass;

/// Parsing: io::parse_flux2_transformer_config (ConfigError "<label>: '<key>' <problem>", one line).
/// Reads `<transformer_dir>/config.json`; errors are labelled "transformer folder '<dir>': config.json".
TransformerConfig read_transformer_config(const std::string& transformer_dir);

}  // namespace fluxmpi::flux2
