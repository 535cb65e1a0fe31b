#include "pipeline/control_residuals.h"

#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "models/flux/latents.h"

namespace fluxmpi::pipeline {

double control_keep(int64_t step, int64_t steps, double start, double end) {
  const double i = static_cast<double>(step), n = static_cast<double>(steps);
  return (i / n < start || (i + 1) / n > end) ? 0.0 : 1.0;
}

bool run_acts(const ControlRun& run, int64_t step, int64_t steps, int64_t patches) {
  return patches > 1 || control_keep(step, steps, run.guidance_start, run.guidance_end) > 0;
}

ControlRouting control_routing(const io::ResidualLayout& layout, const io::TransformerConfig& transformer,
                               const std::vector<ControlRun>& runs, int64_t steps, int64_t patches) {
  ControlRouting r;
  for (int64_t b = 0; b < transformer.num_blocks(); ++b) r.sample_of_block.push_back(layout.sample_of_block(b, transformer));
  for (int64_t i = 0; i < steps; ++i) {
    bool any = false;
    for (const ControlRun& run : runs) any = any || run_acts(run, i, steps, patches);
    r.active_steps.push_back(any);
  }
  return r;
}

ControlResiduals::ControlResiduals(std::vector<flux::FluxControlNet> nets, std::vector<ControlRun> runs,
                                   const DenoiseSetup& setup, double guidance)
    : nets_(std::move(nets)), runs_(std::move(runs)), setup_(setup), guidance_(guidance) {
  FLUX_CHECK(!runs_.empty(), "ControlNet residuals without a run");
  std::vector<const io::ControlNetConfig*> configs;
  for (const ControlRun& run : runs_) {
    FLUX_CHECK(run.net < nets_.size(), "ControlNet run of net ", run.net, " of ", nets_.size());
    configs.push_back(&nets_[run.net]->config());
  }
  layout_ = io::merged_layout(configs);
  c10::InferenceMode guard;
  const at::Tensor img_ids = flux::image_position_ids(setup.latent_height, setup.latent_width).to(setup.device);
  const at::Tensor txt_ids = flux::text_position_ids(setup.text_tokens).to(setup.device);
  for (const flux::FluxControlNet& net : nets_) {
    flux::RopeTables t = net->rope(txt_ids, img_ids);
    rope_.push_back({t.cos.to(setup.device), t.sin.to(setup.device)});
  }
}

void ControlResiduals::set_group(size_t group, const std::vector<at::Tensor>& controls) {
  FLUX_CHECK(controls.size() == runs_.size(), controls.size(), " control inputs for ", runs_.size(), " ControlNet runs");
  c10::InferenceMode guard;
  std::vector<at::Tensor> embedded;
  for (size_t k = 0; k < runs_.size(); ++k) {
    at::Tensor c = nets_[runs_[k].net]->embed_condition(controls[k]);
    FLUX_CHECK(c.size(1) == setup_.image_tokens(), "ControlNet condition of ", c.size(1), " tokens for ",
               setup_.image_tokens(), " image tokens");
    embedded.push_back(c);
  }
  conditions_[group] = std::move(embedded);
}

void ControlResiduals::take_inputs(std::vector<GroupInputs>& groups) {
  for (size_t g = 0; g < groups.size(); ++g) {
    at::Tensor& all = groups[g].controlnet;
    if (!all.defined()) continue;  // a group this leader never takes (--stages) may have none
    std::vector<at::Tensor> controls;
    for (int64_t k = 0; k < all.size(1); ++k) controls.push_back(all.select(1, k));
    set_group(g, controls);
    all = at::Tensor();
  }
}

std::vector<at::Tensor> ControlResiduals::samples(const ResidualRequest& r, const flux::TransformerInputs& in) {
  const auto it = conditions_.find(r.group);
  FLUX_CHECK(it != conditions_.end(), "no control inputs for work group ", r.group);
  const int64_t m = in.latents.size(0);
  const bool windowed = r.patch >= 0 || r.fills;
  std::vector<std::vector<flux::KvCache>>& caches = kv_[r.group];
  caches.resize(runs_.size());
  std::vector<at::Tensor> merged(static_cast<size_t>(layout_.samples()));
  bool any = false;
  for (size_t k = 0; k < runs_.size(); ++k) {
    const ControlRun& run = runs_[k];
    if (!run_acts(run, r.step, setup_.steps, setup_.patches)) continue;
    const flux::FluxControlNet& net = nets_[run.net];
    const io::ControlNetConfig& c = net->config();
    flux::ControlNetInputs ci;
    ci.latents = in.latents;
    ci.condition = r.patch < 0 ? it->second[k] : it->second[k].narrow(1, r.image.first, r.image.count);
    if (c.is_union())
      ci.mode = at::full({m}, run.mode, at::TensorOptions().dtype(at::kLong).device(setup_.device));
    ci.text = in.text;
    ci.pooled = in.pooled;
    ci.timestep = in.timestep;
    if (c.guidance_embeds)
      ci.guidance = at::full({m}, static_cast<float>(guidance_), at::TensorOptions().dtype(at::kFloat).device(setup_.device));
    flux::StreamState s = net->embed(ci);
    flux::RopeTables rope = rope_[run.net];
    std::vector<flux::KvCache>* kv = nullptr;
    if (windowed) {
      std::vector<flux::KvCache>& cache = caches[k];
      const int64_t text = c.text_tokens(setup_.text_tokens);
      if (cache.empty()) {
        FLUX_CHECK(r.fills, "patch ", r.patch, " of step ", r.step, " without ControlNet caches filled before it");
        cache = net->kv_caches(m, text + setup_.image_tokens(), at::TensorOptions().dtype(setup_.dtype).device(setup_.device));
      }
      const int64_t offset = r.offset(text);
      for (flux::KvCache& kc : cache) kc.offset = offset;
      if (r.patch >= 0) rope = {rope.cos.narrow(0, offset, s.text_len + r.image.count), rope.sin.narrow(0, offset, s.text_len + r.image.count)};
      kv = &cache;
    }
    const double scale = run.scale * control_keep(r.step, setup_.steps, run.guidance_start, run.guidance_end);
    const std::vector<at::Tensor> out = net->run_blocks(s, rope, scale, kv);
    // FluxMultiControlNetModel: the first run's samples, then each later run's added where it has
    // samples of that kind (zip keeps the shorter list: the merged layout's counts).
    for (int64_t j = 0; j < layout_.samples(); ++j) {
      const bool is_double = j < layout_.double_samples;
      if ((is_double ? c.num_layers : c.num_single_layers) == 0) continue;
      const int64_t own = is_double ? j : c.num_layers + (j - layout_.double_samples);
      at::Tensor& slot = merged[static_cast<size_t>(j)];
      slot = slot.defined() ? slot + out[static_cast<size_t>(own)] : out[static_cast<size_t>(own)];
    }
    any = true;
  }
  FLUX_CHECK(any, "ControlNet residuals asked for step ", r.step, " where no ControlNet acts");
  // A sample only skipped runs have (their keep is 0 at this step) adds zeros, as diffusers' does.
  for (at::Tensor& slot : merged)
    if (!slot.defined())
      slot = at::zeros({m, r.image.count, nets_.front()->config().inner_dim()}, at::TensorOptions().dtype(setup_.dtype).device(setup_.device));
  if (r.last) caches.clear();
  return merged;
}

}  // namespace fluxmpi::pipeline
