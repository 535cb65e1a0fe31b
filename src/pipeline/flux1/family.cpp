#include "pipeline/flux1/family.h"

#include "core/log.h"
#include "models/flux/controlnet.h"
#include "models/flux/lora_targets.h"
#include "models/flux/transformer.h"
#include "models/vae/image_processor.h"
#include "pipeline/control_residuals.h"
#include "parallel/stored_weights.h"
#include "pipeline/flux1/loras.h"
#include "pipeline/noise.h"
#include "pipeline/run_plan.h"

namespace fluxmpi::pipeline {
namespace {

// AutoencoderKL's decode path, with the folder's VAE config.
class Flux1Decoder : public ImageDecoder {
 public:
  Flux1Decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device)
      : decoder_(vae::load_vae_decoder(dir, dtype, device)), config_(dir.vae_config()) {}
  std::vector<io::RgbImage> decode(const at::Tensor& packed, const flux::LatentGeometry& geometry,
                                   const vae::DecodeOptions& options) const override {
    return vae::decode_images(decoder_, packed, geometry, config_, options);
  }

 private:
  vae::VaeDecoder decoder_;
  io::VaeConfig config_;
};

class Flux1Family : public Family {
 public:
  const char* name() const override { return "flux1"; }
  bool holds(const io::ModelDir& dir) const override { return dir.family() == io::ModelFamily::Flux1; }
  std::unique_ptr<FamilyRoot> root() const override { return flux1_root(); }
  bool second_prompt() const override { return true; }

  void plan_transformer(const io::ModelDir& dir, parallel::PlanRequest& request) const override {
    request.transformer = dir.transformer_config();
    request.stored = parallel::gguf_stored_weights(dir, request.transformer);
  }

  std::shared_ptr<flux::StageModel> load_part(const io::ModelDir& dir, const RunPlan& plan, const parallel::StagePlan& stages,
                                              int stage, at::ScalarType dtype, at::Device device,
                                              nn::LoadStats* stats) const override {
    const parallel::StageBlocks& b = stages.blocks(stage);
    flux::TransformerPart tp{b.first, b.last + 1, stages.owns_embedders(stage), stages.owns_final_layer(stage)};
    // Every rank opens the LoRAs itself and merges only the updates of the modules it loads.
    const LoraFiles loras = open_lora_files(plan.loras);
    auto applied = std::make_shared<std::vector<int64_t>>();
    nn::WeightAdjust merge;
    if (!loras.empty()) merge = flux::flux_lora_set(loras, dir.transformer_config()).adjust(applied);
    std::shared_ptr<flux::StageModel> part = flux::load_flux_transformer(dir, tp, dtype, device, stats, merge).ptr();
    for (size_t f = 0; f < loras.size(); ++f)
      log::debug("LoRA ", io::lora_spec_text(loras[f]->spec()), ": merged into ", (*applied)[f], " weights of blocks ",
                 b.describe());
    return part;
  }

  sched::Schedule schedule(const io::ModelDir& dir, int64_t steps, int64_t image_tokens) const override {
    return sched::flux_schedule(dir.scheduler_config(), steps, image_tokens);
  }

  at::Tensor initial_latents(int64_t seed, const flux::LatentGeometry& geometry, at::ScalarType dtype) const override {
    return pipeline::initial_latents(seed, geometry, dtype);
  }

  std::unique_ptr<ImageDecoder> decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device) const override {
    return std::make_unique<Flux1Decoder>(dir, dtype, device);
  }

  TileDecoder tile_decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device) const override {
    return tile_decoder_of(std::make_shared<vae::VaeDecoder>(vae::load_vae_decoder(dir, dtype, device)));
  }

  ControlRouting control_routing(const io::ModelDir& dir, const RunPlan& plan) const override {
    if (plan.controlnets.empty()) return {};
    return pipeline::control_routing(plan.control_layout, dir.transformer_config(), plan.control_runs, plan.steps,
                                     plan.patches);
  }

  std::unique_ptr<ResidualSource> residual_source(const RunPlan& plan, at::ScalarType dtype,
                                                  at::Device device) const override {
    if (plan.controlnets.empty()) return nullptr;
    std::vector<flux::FluxControlNet> nets;
    for (const std::string& dir : plan.controlnets) nets.push_back(flux::load_flux_controlnet(dir, dtype, device));
    DenoiseSetup setup;
    setup.steps = plan.steps;
    setup.text_tokens = plan.text_tokens;
    setup.latent_height = plan.latent_height;
    setup.latent_width = plan.latent_width;
    setup.patches = plan.patches;
    setup.warmup_steps = plan.warmup_steps;
    setup.dtype = dtype;
    setup.device = device;
    return std::make_unique<ControlResiduals>(std::move(nets), plan.control_runs, setup, plan.controlnet_guidance);
  }
};

}  // namespace

const Family& flux1_family() {
  static const Flux1Family family;
  return family;
}

}  // namespace fluxmpi::pipeline
