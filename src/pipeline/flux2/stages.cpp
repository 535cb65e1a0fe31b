#include "pipeline/flux2/stages.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "models/common/loader.h"
#include "models/flux2/latents.h"
#include "models/flux2/transformer.h"
#include "models/flux2/vae.h"
#include "models/llm/decoder_config.h"
#include "models/llm/text_encoder.h"
#include "pipeline/text_split.h"
#include "sched/flux2_schedule.h"
#include "text/flux2_prompts.h"

namespace fluxmpi::pipeline {

namespace {

// A prompt as the text encoder takes it: the chat template's ids and mask, truncated and padded
// to max_length, with a warning when the template is cut. `what` names the prompt.
pipeline::PromptEmbedding prompt_tokens(const text::Flux2Tokenizer& tokenizer, const std::string& prompt,
                                        int64_t max_length, const std::string& what) {
  const text::PromptTokens t = text::tokenize_flux2_prompt(tokenizer, prompt, max_length);
  if (t.truncated())
    log::warn(what, ": the prompt's ", t.num_tokens, " tokens (chat template included) are cut to --max-sequence-length ",
              max_length, " as diffusers does");
  pipeline::PromptEmbedding e;
  e.input_ids = at::tensor(t.ids, at::kLong);
  e.attention_mask = at::tensor(t.mask, at::kLong);
  return e;
}

}  // namespace

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
  pipeline::PromptEmbedding e = prompt_tokens(impl_->tokenizer, prompt, max_length, what);
  const at::Tensor ids = e.input_ids.unsqueeze(0).to(impl_->device);
  const at::Tensor mask = e.attention_mask.unsqueeze(0).to(impl_->device);
  e.prompt_embeds = impl_->decoder->encode(ids, mask, impl_->layers)[0];
  return e;
}

int64_t Flux2TextStage::parameter_bytes() const { return nn::parameter_bytes(*impl_->decoder); }

struct Flux2SplitTextStage::Impl {
  parallel::TextSplitPlan plan;
  llm::TextDecoder part{nullptr};
  std::optional<text::Flux2Tokenizer> tokenizer;  // rank 0
  std::vector<int64_t> layers;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
};

Flux2SplitTextStage::Flux2SplitTextStage(const io::ModelDir& dir, const std::vector<parallel::BlockRange>& slices,
                                         const std::vector<int64_t>& layers, int rank, at::ScalarType dtype, at::Device device)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const std::string te = dir.component_dir("text_encoder");
  const llm::DecoderConfig config = llm::read_decoder_config(te);
  m.layers = layers;
  m.dtype = dtype;
  m.device = device;
  m.plan.layers = *std::max_element(layers.begin(), layers.end());
  m.plan.final_norm = m.plan.layers == config.num_hidden_layers;
  for (size_t r = 0; r < slices.size(); ++r) {
    parallel::TextSlice t;
    t.rank = static_cast<int>(r);
    t.first_layer = slices[r].first;
    t.end_layer = slices[r].last + 1;
    t.embeddings = r == 0;
    t.final_norm = m.plan.final_norm && r + 1 == slices.size();
    m.plan.slices.push_back(t);
  }
  if (rank == 0) m.tokenizer.emplace(dir.component_dir("tokenizer"), dir.label("tokenizer"));
  if (m.plan.slice_of(rank) != nullptr) {
    const io::TensorStore store = io::TensorStore::open_dir(te, dir.label("text_encoder"));
    m.part = pipeline::load_text_slice(m.plan, rank, config, store, layers, dtype, device);
  }
}

Flux2SplitTextStage::~Flux2SplitTextStage() = default;

std::vector<pipeline::PromptEmbedding> Flux2SplitTextStage::encode(const parallel::MpiEnv& env, parallel::Messenger* messenger,
                                                                   const std::vector<std::string>& prompts,
                                                                   int64_t max_length) const {
  c10::InferenceMode guard;
  const Impl& m = *impl_;
  std::vector<pipeline::PromptEmbedding> out;
  std::vector<pipeline::PromptTokens> tokens;
  if (m.tokenizer) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      pipeline::PromptEmbedding e = prompt_tokens(*m.tokenizer, prompts[i], max_length, str_cat("prompt ", i));
      tokens.push_back({e.input_ids.unsqueeze(0), e.attention_mask.unsqueeze(0)});
      out.push_back(std::move(e));
    }
  }
  const std::vector<at::Tensor> embeds =
      pipeline::encode_prompts_split(m.plan, env, messenger, m.part, tokens, m.layers, m.dtype, m.device);
  for (size_t i = 0; i < embeds.size() && i < out.size(); ++i) out[i].prompt_embeds = embeds[i][0];
  return out;
}

std::string Flux2SplitTextStage::describe() const {
  std::string s = "text encoder split over ranks:";
  for (const parallel::TextSlice& t : impl_->plan.slices)
    s += str_cat(" rank ", t.rank, " layers ", t.first_layer, "-", t.end_layer - 1);
  return s;
}

std::shared_ptr<flux::StageModel> load_flux2_stage(const io::ModelDir& dir, int64_t first, int64_t end, bool embedders,
                                                   bool final_layer, at::ScalarType dtype, at::Device device,
                                                   nn::LoadStats* stats) {
  flux2::TransformerPart part;
  part.first_block = first;
  part.end_block = end;
  part.embedders = embedders;
  part.final_layer = final_layer;
  flux2::Flux2Transformer t =
      flux2::load_flux2_transformer(dir.flux2_transformer_config(), dir.open_weights("transformer"), part, dtype, device, stats);
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

}  // namespace fluxmpi::pipeline
