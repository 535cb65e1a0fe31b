// Fields of transformers Qwen3Config and MistralConfig (the text_config of Mistral3Config).

#include "models/llm/decoder_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::llm {
namespace {

// Reads the fields of one JSON object; errors go through the file's reader so that they name the
// file, with `prefix` ("text_config.") naming the nested object.
class Fields {
 public:
  Fields(const io::ConfigReader& reader, const nlohmann::json& object, std::string prefix)
      : reader_(reader), object_(object), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    reader_.fail(prefix_ + key, problem);
  }
  const nlohmann::json* find(const std::string& key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  const nlohmann::json& required(const std::string& key) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) fail(key, "is missing (required by the text encoder)");
    return *v;
  }
  int64_t positive(const std::string& key) const {
    const nlohmann::json& v = required(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1) fail(key, str_cat("must be a positive integer, got ", v.dump()));
    return v.get<int64_t>();
  }
  double positive_number(const nlohmann::json& v, const std::string& key) const {
    if (!v.is_number() || !(v.get<double>() > 0)) fail(key, str_cat("must be a positive number, got ", v.dump()));
    return v.get<double>();
  }
  double positive_number(const std::string& key) const { return positive_number(required(key), key); }
  bool boolean(const std::string& key, bool fallback) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, str_cat("must be true or false, got ", v->dump()));
    return v->get<bool>();
  }
  // A feature this decoder does not implement must be absent, null or the given value.
  void require_absent(const std::string& key, const std::string& why) const {
    if (find(key) != nullptr) fail(key, str_cat("must be null: ", why, ", got ", find(key)->dump()));
  }

 private:
  const io::ConfigReader& reader_;
  const nlohmann::json& object_;
  std::string prefix_;
};

Architecture architecture_of(const io::ConfigReader& r) {
  const nlohmann::json& j = r.json();
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() && a->front().is_string()) {
    const std::string name = a->front().get<std::string>();
    if (name == "Qwen3ForCausalLM" || name == "Qwen3Model") return Architecture::Qwen3;
    if (name == "Mistral3ForConditionalGeneration") return Architecture::Mistral3;
    r.fail("architectures", str_cat("must be Qwen3ForCausalLM or Mistral3ForConditionalGeneration, got \"", name, "\""));
  }
  const std::string type = r.string("model_type", "");
  if (type == "qwen3") return Architecture::Qwen3;
  if (type == "mistral3") return Architecture::Mistral3;
  r.fail("architectures", "is missing (and model_type is neither qwen3 nor mistral3)");
}

void parse_common(const Fields& f, DecoderConfig& c) {
  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.intermediate_size = f.positive("intermediate_size");
  c.num_hidden_layers = f.positive("num_hidden_layers");
  c.num_attention_heads = f.positive("num_attention_heads");
  c.num_key_value_heads = f.positive("num_key_value_heads");
  c.head_dim = f.positive("head_dim");
  c.rms_norm_eps = f.positive_number("rms_norm_eps");
  // transformers 5 moves the base frequency into rope_parameters; 4.x writes rope_theta.
  if (f.find("rope_theta") != nullptr || f.find("rope_parameters") == nullptr) {
    c.rope_theta = f.positive_number("rope_theta");
  } else {
    const nlohmann::json& p = *f.find("rope_parameters");
    const auto type = p.find("rope_type");
    if (!p.is_object() || (type != p.end() && *type != "default"))
      f.fail("rope_parameters", str_cat("must be the default RoPE, got ", p.dump()));
    if (!p.contains("rope_theta")) f.fail("rope_parameters.rope_theta", "is missing (required by the text encoder)");
    c.rope_theta = f.positive_number(p["rope_theta"], "rope_parameters.rope_theta");
  }
  f.require_absent("rope_scaling", "only the default RoPE is implemented");
  const nlohmann::json& act = f.required("hidden_act");
  if (act != "silu") f.fail("hidden_act", str_cat("must be \"silu\", got ", act.dump()));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail("num_key_value_heads", str_cat("(", c.num_key_value_heads, ") must divide num_attention_heads (",
                                          c.num_attention_heads, ")"));
  if (c.head_dim % 2 != 0) f.fail("head_dim", str_cat("must be even for rotary embeddings, got ", c.head_dim));
}

}  // namespace

const char* architecture_name(Architecture a) {
  return a == Architecture::Qwen3 ? "Qwen3ForCausalLM" : "Mistral3ForConditionalGeneration";
}

DecoderConfig parse_decoder_config(const io::ConfigReader& r) {
  DecoderConfig c;
  c.architecture = architecture_of(r);
  if (c.architecture == Architecture::Qwen3) {
    Fields f(r, r.json(), "");
    parse_common(f, c);
    c.qk_norm = true;
    c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
    if (f.boolean("attention_bias", false)) f.fail("attention_bias", "must be false: Qwen3 projections have no bias here");
    if (f.boolean("use_sliding_window", false)) f.fail("use_sliding_window", "must be false: sliding-window attention is not implemented");
    return c;
  }
  const nlohmann::json* text = r.has("text_config") ? &r.json().at("text_config") : nullptr;
  if (text == nullptr || !text->is_object()) r.fail("text_config", "is missing or not an object (Mistral3 keeps its decoder there)");
  Fields f(r, *text, "text_config.");
  if (const nlohmann::json* type = f.find("model_type"); type != nullptr && *type != "mistral")
    f.fail("model_type", str_cat("must be \"mistral\", got ", type->dump()));
  parse_common(f, c);
  c.qk_norm = false;
  // Mistral3ForConditionalGeneration reads tie_word_embeddings from the top level.
  c.tie_word_embeddings = Fields(r, r.json(), "").boolean("tie_word_embeddings", false);
  if (const nlohmann::json* w = f.find("sliding_window"); w != nullptr) {
    if (!w->is_number_integer() || w->get<int64_t>() < 1) f.fail("sliding_window", str_cat("must be null or a positive integer, got ", w->dump()));
    c.sliding_window = w->get<int64_t>();
  }
  return c;
}

DecoderConfig read_decoder_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return parse_decoder_config(io::ConfigReader::from_file(path, path));
}

std::vector<int64_t> default_out_layers(Architecture a) {
  // diffusers Flux2KleinPipeline / Flux2Pipeline `text_encoder_out_layers` defaults.
  if (a == Architecture::Qwen3) return {9, 18, 27};
  return {10, 20, 30};
}

}  // namespace fluxmpi::llm
