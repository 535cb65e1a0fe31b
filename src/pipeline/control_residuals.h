#pragma once
/// FluxControlNetPipeline's ControlNet calls (diffusers 0.40), as rank 0 of a pipeline makes them in
/// the step loop (pipeline/denoise.h): every "run" is one ControlNet on one control image; per step
/// each run acts with its conditioning scale times diffusers' controlnet_keep (0 outside its
/// [control_guidance_start, control_guidance_end] window), and the runs' samples merge as
/// FluxMultiControlNetModel merges them (io::merged_layout). A Union ControlNet given several
/// control images is run once per image (FluxMultiControlNetModel([net]) in diffusers).
///
/// A run whose keep is 0 at a step would add zeros (its samples times 0): it is skipped, and a step
/// where every run is skipped carries no residuals at all; the values are those of diffusers, which
/// adds the zeros. With patch pipelining every run acts at every step, so that its key/value caches
/// follow the latents as the transformer's do.
///
/// The ControlNet sees the unit's latents, the conditional prompt (true CFG's negative pass reuses
/// the conditional residuals), the timestep, and its own guidance: guidance_scale when the first
/// net's config has a guidance embedder (FluxControlNetPipeline asks nets[0]), none otherwise.

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <vector>

#include "io/controlnet_config.h"
#include "models/flux/controlnet.h"
#include "pipeline/denoise.h"

namespace fluxmpi::pipeline {

/// One ControlNet on one control image.
struct ControlRun {
  size_t net = 0;               ///< index into the loaded ControlNets
  int64_t mode = -1;            ///< Union models: the control mode (else unused)
  double scale = 1.0;           ///< controlnet_conditioning_scale
  double guidance_start = 0.0;  ///< control_guidance_start
  double guidance_end = 1.0;    ///< control_guidance_end
};

/// diffusers' controlnet_keep of step i of N: 1 - float(i / N < start or (i + 1) / N > end).
double control_keep(int64_t step, int64_t steps, double start, double end);
/// Whether the run acts at `step` (of `steps`) in a loop with `patches` patches.
bool run_acts(const ControlRun& run, int64_t step, int64_t steps, int64_t patches);

/// The routing every rank needs (DenoiseSetup::control): which block adds which merged sample, and
/// the steps where some run acts.
ControlRouting control_routing(const io::ResidualLayout& layout, const io::TransformerConfig& transformer,
                               const std::vector<ControlRun>& runs, int64_t steps, int64_t patches);

/// Rank 0's ControlNets.
class ControlResiduals : public ResidualSource {
 public:
  /// `nets` loaded in the run dtype on the run device; `setup` the step loop's (its steps, patches,
  /// text tokens, latent size, dtype and device: kept); `guidance` the pipeline's guidance_scale.
  ControlResiduals(std::vector<flux::FluxControlNet> nets, std::vector<ControlRun> runs, const DenoiseSetup& setup,
                   double guidance);

  /// The layout of the merged samples (io::merged_layout of the runs' nets).
  const io::ResidualLayout& layout() const { return layout_; }
  const std::vector<ControlRun>& runs() const { return runs_; }
  const flux::FluxControlNet& net(size_t i) const { return nets_.at(i); }

  /// The control inputs of work group `group`, one per run, [m, L, in_channels] packed latents or
  /// [m, 3, H, W] pixels (XLabs layout), in the run dtype: embedded once, kept for every step.
  void set_group(size_t group, const std::vector<at::Tensor>& controls);
  /// set_group of every group from its GroupInputs::controlnet ([m, K, ...]), which it then drops.
  void take_inputs(std::vector<GroupInputs>& groups) override;

  std::vector<at::Tensor> samples(const ResidualRequest& request, const flux::TransformerInputs& in) override;

 private:
  std::vector<flux::FluxControlNet> nets_;
  std::vector<ControlRun> runs_;
  DenoiseSetup setup_;
  double guidance_;
  io::ResidualLayout layout_;
  std::vector<flux::RopeTables> rope_;                          // per net: the whole sequence's tables
  std::map<size_t, std::vector<at::Tensor>> conditions_;         // group -> per run [m, L, D]
  std::map<size_t, std::vector<std::vector<flux::KvCache>>> kv_;  // group -> per run, per block
};

}  // namespace fluxmpi::pipeline
