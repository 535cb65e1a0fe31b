#include "app/flux2_stages.h"

#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "core/log.h"
#include "models/common/loader.h"
#include "models/flux2/latents.h"
#include "models/flux2/transformer.h"
#include "models/flux2/vae.h"
#include "models/llm/text_encoder.h"
#include "sched/flux2_schedule.h"
#include "text/flux2_prompts.h"

namespace fluxmpi::app {

struct Flux2TextStage::Impl {
  text::Flux2Tokenizer tokenizer;
  llm::TextDecoder decoder{nullptr};
  std::vector<int64_t> layers;
  at::Device device = at::kCPU;
};

Flux2TextStage::Flux2TextStage(const io::ModelDir& dir, const std::vector<int64_t>& layers, at::ScalarType dtype,
                               at::Device device)
    : impl_(std::make_unique<Impl>(Impl{text::Flux2Tokenizer(dir.component_dir("tokenizer"), dir.label("tokenizer")),
                                        llm::TextDecoder{nullptr}, layers, device})) {
  impl_->decoder = llm::load_text_encoder(dir.component_dir("text_encoder"), layers, dtype, device);
}

Flux2TextStage::~Flux2TextStage() = default;
Flux2TextStage::Flux2TextStage(Flux2TextStage&&) noexcept = default;

pipeline::PromptEmbedding Flux2TextStage::encode(const std::string& prompt, int64_t max_length,
                                                 const std::string& what) const {
  c10::InferenceMode guard;
  const text::PromptTokens t = text::tokenize_flux2_prompt(impl_->tokenizer, prompt, max_length);
  if (t.truncated())
    log::warn(what, ": the prompt's ", t.num_tokens, " tokens (chat template included) are cut to --max-sequence-length ",
              max_length, " as diffusers does");
  pipeline::PromptEmbedding e;
  e.input_ids = at::tensor(t.ids, at::kLong);
  e.attention_mask = at::tensor(t.mask, at::kLong);
  const at::Tensor ids = e.input_ids.unsqueeze(0).to(impl_->device);
  const at::Tensor mask = e.attention_mask.unsqueeze(0).to(impl_->device);
  e.prompt_embeds = impl_->decoder->encode(ids, mask, impl_->layers)[0];
  return e;
}

int64_t Flux2TextStage::parameter_bytes() const { return nn::parameter_bytes(*impl_->decoder); }

std::shared_ptr<flux::StageModel> load_flux2_stage(const io::ModelDir& dir, int64_t first, int64_t end, bool embedders,
                                                   bool final_layer, at::ScalarType dtype, at::Device device,
                                                   nn::LoadStats* stats) {
  flux2::TransformerPart part;
  part.first_block = first;
  part.end_block = end;
  part.embedders = embedders;
  part.final_layer = final_layer;
  flux2::Flux2Transformer t = flux2::load_flux2_transformer(dir.component_dir("transformer"), part, dtype, device, stats);
  return t.ptr();
}

at::Tensor flux2_initial_latents(int64_t seed, const flux::LatentGeometry& geometry, at::ScalarType dtype) {
  return flux2::pack_latents(flux2::initial_noise(std::vector<int64_t>{seed}, geometry, dtype));
}

sched::Schedule flux2_run_schedule(const io::ModelDir& dir, int64_t steps, int64_t image_tokens) {
  return sched::flux2_schedule(dir.scheduler_config(), steps, image_tokens);
}

struct Flux2Decoder::Impl {
  flux2::Vae vae;
};

Flux2Decoder::Flux2Decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device)
    : impl_(std::make_unique<Impl>(Impl{flux2::load_vae(dir.component_dir("vae"), dtype, device)})) {}

Flux2Decoder::~Flux2Decoder() = default;

std::vector<io::RgbImage> Flux2Decoder::decode(const at::Tensor& packed, const flux::LatentGeometry& geometry,
                                               const vae::DecodeOptions& options) const {
  c10::InferenceMode guard;
  return impl_->vae.decode_images(packed, flux2::latent_ids(geometry).to(packed.device()), options);
}

}  // namespace fluxmpi::app
