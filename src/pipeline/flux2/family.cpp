#include "pipeline/flux2/family.h"

#include <map>
#include <optional>

#include "models/flux2/vae.h"
#include "parallel/stored_weights.h"
#include "pipeline/flux2/stages.h"
#include "pipeline/prepared_run.h"
#include "pipeline/run_plan.h"

namespace fluxmpi::pipeline {
namespace {

// FLUX.2's stage 1 over the ranks holding the text encoder's slices: rank 0's distinct prompts (and
// klein base's empty negative prompt) in order, every rank taking part.
class Flux2Split : public SplitTextStage {
 public:
  Flux2Split(const io::ModelDir& dir, const RunPlan& plan, int rank, at::ScalarType dtype, at::Device device)
      : stage_(dir, plan.text_slices, plan.text_encoder_layers, rank, dtype, device) {}

  void encode(const parallel::MpiEnv& env, const PreparedRun* run, PromptEmbeddings* out) const override {
    std::vector<std::string> distinct;
    std::map<std::string, size_t> index;
    if (run != nullptr) {
      auto add = [&](const std::string& p) {
        if (index.emplace(p, distinct.size()).second) distinct.push_back(p);
      };
      for (size_t i = 0; i < run->images.size(); ++i) {
        if (run->progress[i].decoded || !run->progress[i].needs_encoding) continue;
        add(run->images[i].prompt);
        if (run->plan.passes == 2) add("");
      }
    }
    std::unique_ptr<parallel::Messenger> messenger = std::make_unique<parallel::Messenger>(env);
    const int64_t msl = run != nullptr ? *run->config.max_sequence_length : 0;
    const std::vector<PromptEmbedding> embeds = stage_.encode(env, messenger.get(), distinct, msl);
    messenger->wait_all();
    if (run == nullptr) return;
    out->text.resize(run->images.size());
    out->negative.resize(run->images.size());
    for (size_t i = 0; i < run->images.size(); ++i) {
      if (run->progress[i].decoded || !run->progress[i].needs_encoding) continue;
      out->text[i] = embeds.at(index.at(run->images[i].prompt));
      if (run->plan.passes == 2) out->negative[i] = embeds.at(index.at(""));
    }
  }

  std::string describe() const override { return stage_.describe(); }

 private:
  Flux2SplitTextStage stage_;
};

class Flux2Family : public Family {
 public:
  const char* name() const override { return "flux2"; }
  bool holds(const io::ModelDir& dir) const override { return dir.family() == io::ModelFamily::Flux2; }
  std::unique_ptr<FamilyRoot> root() const override { return flux2_root(); }
  bool second_prompt() const override { return false; }

  void plan_transformer(const io::ModelDir& dir, parallel::PlanRequest& request) const override {
    request.transformer = io::transformer_shape(dir.flux2_transformer_config());
    request.family = parallel::flux2_family_costs(dir.flux2_transformer_config());
    request.stored = parallel::gguf_stored_weights(dir, request.transformer);
  }

  std::shared_ptr<flux::StageModel> load_part(const io::ModelDir& dir, const RunPlan&, const parallel::StagePlan& stages,
                                              int stage, at::ScalarType dtype, at::Device device,
                                              nn::LoadStats* stats) const override {
    const parallel::StageBlocks& b = stages.blocks(stage);
    return load_flux2_stage(dir, b.first, b.last + 1, stages.owns_embedders(stage), stages.owns_final_layer(stage), dtype,
                            device, stats);
  }

  std::unique_ptr<SplitTextStage> split_text_stage(const io::ModelDir& dir, const RunPlan& plan, int rank,
                                                   at::ScalarType dtype, at::Device device) const override {
    return std::make_unique<Flux2Split>(dir, plan, rank, dtype, device);
  }

  sched::Schedule schedule(const io::ModelDir& dir, int64_t steps, int64_t image_tokens) const override {
    return flux2_run_schedule(dir, steps, image_tokens);
  }

  at::Tensor initial_latents(int64_t seed, const flux::LatentGeometry& geometry, at::ScalarType dtype) const override {
    return flux2_initial_latents(seed, geometry, dtype);
  }

  std::unique_ptr<ImageDecoder> decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device) const override {
    return std::make_unique<Flux2Decoder>(dir, dtype, device);
  }

  // AutoencoderKLFlux2 decodes with the FLUX.1 decoder (post_quant_conv + Decoder); its bn statistics
  // act on the packed latents before the leader cuts tiles.
  TileDecoder tile_decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device) const override {
    auto vae = std::make_shared<flux2::Vae>(flux2::load_vae(dir.component_dir("vae"), dtype, device));
    return tile_decoder_of(std::shared_ptr<vae::VaeDecoder>(vae, &vae->decoder()));
  }
};

}  // namespace

const Family& flux2_family() {
  static const Flux2Family family;
  return family;
}

}  // namespace fluxmpi::pipeline
