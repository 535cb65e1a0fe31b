#include "pipeline/text_stage.h"

#include <c10/core/InferenceMode.h>

#include "core/log.h"
#include "models/clip_text.h"
#include "models/common/loader.h"
#include "models/common/lora.h"
#include "models/t5_encoder.h"
#include "text/clip_tokenizer.h"
#include "text/t5_tokenizer.h"

namespace fluxmpi::pipeline {

struct TextEncoders::Impl {
  text::ClipTokenizer clip_tokenizer;
  text::T5Tokenizer t5_tokenizer;
  text_models::ClipTextModel clip{nullptr};
  text_models::T5EncoderModel t5{nullptr};
  at::Device device;
  at::ScalarType dtype;

  Impl(const io::ModelDir& dir, at::ScalarType dtype_, at::Device dev,
       const std::vector<std::shared_ptr<const io::LoraFile>>& loras)
      : clip_tokenizer(dir.component_dir("tokenizer"), dir.label("tokenizer")),
        t5_tokenizer(dir.component_dir("tokenizer_2"), dir.label("tokenizer_2")),
        device(dev),
        dtype(dtype_) {
    {
      io::TensorStore store = dir.open_weights("text_encoder");
      clip = text_models::load_clip_text_model(dir.clip_config(), store, dtype, dev,
                                               text_encoder_loras(loras, io::LoraTarget::Clip, store));
    }
    io::TensorStore store = dir.open_weights("text_encoder_2");
    t5 = text_models::load_t5_encoder(dir.t5_config(), store, dtype, dev,
                                      text_encoder_loras(loras, io::LoraTarget::T5, store));
  }

  // The merge hook of the LoRAs' pairs for one text encoder (none when no LoRA has any).
  static nn::WeightAdjust text_encoder_loras(const std::vector<std::shared_ptr<const io::LoraFile>>& loras,
                                             io::LoraTarget target, const io::TensorStore& store) {
    if (loras.empty()) return {};
    const nn::WeightShapes shapes = nn::linear_weight_shapes(store);
    nn::LoraSet set(loras, target, shapes, nn::underscored_names(shapes));
    if (set.empty()) return {};
    log::debug(io::lora_target_name(target), ": merging ", set.updates().size(), " LoRA update(s)");
    return set.adjust();
  }
};

TextEncoders::TextEncoders(const io::ModelDir& dir, at::ScalarType dtype, at::Device device,
                           const std::vector<std::shared_ptr<const io::LoraFile>>& loras)
    : impl_(std::make_unique<Impl>(dir, dtype, device, loras)) {}
TextEncoders::~TextEncoders() = default;
TextEncoders::TextEncoders(TextEncoders&&) noexcept = default;

namespace {
void warn_truncated(const text::Encoding& e, const char* tokenizer, int64_t limit, const std::string& what) {
  if (!e.truncated) return;
  log::warn(what, ": the ", tokenizer, " tokenizer keeps ", limit, " tokens (the prompt has ", e.num_tokens,
            "); this part was dropped: \"", e.dropped, "\"");
}
}  // namespace

PromptEmbedding TextEncoders::encode(const std::string& prompt, const std::string& prompt_2,
                                     int64_t max_sequence_length, const std::string& what) {
  c10::InferenceMode guard;
  Impl& m = *impl_;
  text::Encoding clip_enc = m.clip_tokenizer.encode(prompt);
  warn_truncated(clip_enc, "CLIP", m.clip_tokenizer.max_length() - 2, what);
  const std::string& t5_text = prompt_2.empty() ? prompt : prompt_2;
  text::Encoding t5_enc = m.t5_tokenizer.encode(t5_text, max_sequence_length);
  warn_truncated(t5_enc, "T5", max_sequence_length - 1, what + (prompt_2.empty() ? "" : " (prompt_2)"));

  PromptEmbedding out;
  out.clip_ids = at::tensor(clip_enc.ids, at::kLong);
  out.t5_ids = at::tensor(t5_enc.ids, at::kLong);
  // FluxPipeline casts both outputs to the encoders' dtype (T5 keeps its `wo` in fp32 under fp16).
  out.pooled = m.clip->forward(out.clip_ids.unsqueeze(0).to(m.device)).pooler_output[0].to(m.dtype);
  out.prompt_embeds = m.t5->forward(out.t5_ids.unsqueeze(0).to(m.device)).last_hidden_state[0].to(m.dtype);
  return out;
}

int64_t TextEncoders::parameter_bytes() const {
  return nn::parameter_bytes(*impl_->clip) + nn::parameter_bytes(*impl_->t5);
}

}  // namespace fluxmpi::pipeline
