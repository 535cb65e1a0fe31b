#pragma once
/// The ControlNets a command line asks for (docs/controlnet.md, docs/cli.md), checked against each
/// other and against the transformer before anything heavy runs: `--controlnet DIR` (repeatable),
/// `--control-image FILE` (one per ControlNet, or several for a single Union ControlNet, one per
/// condition), `--control-mode N` (one per control image; Union models only, -1 for a net without
/// modes), `--controlnet-scale S`, `--control-guidance-start A`, `--control-guidance-end B` (each one
/// value for every control image, or one per image).

#include <cstdint>
#include <string>
#include <vector>

#include "io/configs.h"
#include "io/controlnet_config.h"
#include "pipeline/control_residuals.h"

namespace fluxmpi::pipeline {

struct ControlNetOptions {
  std::vector<std::string> nets;    ///< --controlnet
  std::vector<std::string> images;  ///< --control-image (with --controlnet)
  std::vector<int64_t> modes;       ///< --control-mode
  std::vector<double> scales, starts, ends;  ///< --controlnet-scale, --control-guidance-start, -end

  bool any_control_flag() const { return !modes.empty() || !scales.empty() || !starts.empty() || !ends.empty(); }
};

/// The job's ControlNets, resolved.
struct ControlNetSetup {
  std::vector<std::string> nets;               ///< folders, as given
  std::vector<io::ControlNetConfig> configs;   ///< one per net
  std::vector<ControlRun> runs;                ///< one per control image
  std::vector<std::string> images;             ///< the control image of each run
  io::ResidualLayout layout;                   ///< the merged samples
  bool pixels = false;                         ///< XLabs layout: the nets read the pixels, no VAE
};

/// Throws UsageError (one line naming the flag) for ControlNet flags without --controlnet, counts
/// that do not pair, a mode out of range or missing for a Union model or given to a net without
/// modes, a guidance window outside 0 <= start < end <= 1; ConfigError (naming the folder and key)
/// for a config that cannot be read, does not fit the transformer, or nets that cannot run
/// together (layouts or guidance embedders that differ: diffusers asks the first net for both).
ControlNetSetup resolve_controlnets(const ControlNetOptions& options, const io::TransformerConfig& transformer,
                                    int64_t vae_scale_factor);

}  // namespace fluxmpi::pipeline
