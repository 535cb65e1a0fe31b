// Key layouts of transformers Qwen3ForCausalLM and Mistral3ForConditionalGeneration checkpoints.

#include "models/llm/text_encoder.h"

#include "core/error.h"

namespace fluxmpi::llm {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

std::vector<std::string> candidate_prefixes(Architecture a) {
  if (a == Architecture::Qwen3) return {"model."};
  return {"model.language_model.", "language_model.model."};
}

// Keys of the checkpoint class that the text encoder never runs (skipped, never reported).
std::vector<std::string> not_text_tower(Architecture a) {
  if (a == Architecture::Qwen3) return {"lm_head."};
  return {"lm_head.", "language_model.lm_head.", "vision_tower.", "multi_modal_projector.", "model.vision_tower.",
          "model.multi_modal_projector."};
}

}  // namespace

std::string text_tower_prefix(const DecoderConfig& config, const io::TensorStore& store) {
  const std::vector<std::string> prefixes = candidate_prefixes(config.architecture);
  const std::vector<std::string> keys = store.keys();
  for (const auto& p : prefixes)
    for (const auto& k : keys)
      if (starts_with(k, p)) return p;
  std::string names;
  for (const auto& p : prefixes) names += (names.empty() ? "'" : " or '") + p + "*'";
  throw WeightError(str_cat(store.label(), ": no ", architecture_name(config.architecture),
                            " text-tower tensors (expected keys ", names, ")"));
}

nn::LoadRules text_encoder_load_rules(const TextDecoder& model, const io::TensorStore& store) {
  nn::LoadRules rules;
  rules.prefix = text_tower_prefix(model->config(), store);
  rules.skip_prefixes = not_text_tower(model->config().architecture);
  const std::string prefix = rules.prefix;
  rules.owned = [model, prefix](const std::string& key) {
    if (!starts_with(key, prefix)) return model->part().embeddings();  // stray keys: the first part reports them
    return model->owns_key(key.substr(prefix.size()));
  };
  return rules;
}

TextDecoder load_text_decoder(const DecoderConfig& config, const io::TensorStore& store, const DecoderPart& part,
                              at::ScalarType dtype, at::Device device, nn::LoadStats* stats) {
  TextDecoder model(config, part);
  nn::LoadStats s = nn::load_module(*model, store, text_encoder_load_rules(model, store), dtype, device);
  if (stats != nullptr) *stats = s;
  return model;
}

TextDecoder load_text_encoder(const std::string& dir, const std::vector<int64_t>& out_layers, at::ScalarType dtype,
                              at::Device device, nn::LoadStats* stats) {
  const DecoderConfig config = read_decoder_config(dir);
  const std::vector<int64_t> layers = out_layers.empty() ? default_out_layers(config.architecture) : out_layers;
  const DecoderPart part = DecoderPart::for_out_layers(config, layers);
  io::TensorStore store = io::TensorStore::open_dir(dir, str_cat("text encoder '", dir, "'"));
  TextDecoder model = load_text_decoder(config, store, part, dtype, device, stats);
  store.close();
  return model;
}

}  // namespace fluxmpi::llm
