#include "text/flux2_prompts.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "text/encoding.h"
#include "text/tokenizer_files.h"

namespace fluxmpi::text {
namespace {

std::string replace_all(std::string text, const std::string& what, const std::string& with) {
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + with.size()))
    text.replace(at, what.size(), with);
  return text;
}

// "left" / "right" from tokenizer_config.json `key`, or `fallback` when absent.
bool left_side(const JsonFile& config, const char* key, bool fallback) {
  auto it = config.json.find(key);
  if (it == config.json.end() || it->is_null()) return fallback;
  if (*it == "left") return true;
  if (*it == "right") return false;
  throw TokenizerError(str_cat(config.label, ": '", key, "' must be \"left\" or \"right\", got ", it->dump()));
}

std::optional<std::string> string_field(const JsonFile& f, const char* key) {
  auto it = f.json.find(key);
  if (it == f.json.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw TokenizerError(str_cat(f.label, ": '", key, "' must be a string, got ", it->dump()));
  return it->get<std::string>();
}

}  // namespace

const char* const kFlux2SystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation.";

const char* to_string(Flux2TextStyle style) { return style == Flux2TextStyle::Qwen3 ? "Qwen3" : "Mistral"; }

Flux2Tokenizer::Flux2Tokenizer(const std::string& dir, const std::string& label) : bpe_(dir, label) {
  const TokenizerDir d{dir, label.empty() ? dir : label};
  const JsonFile config = read_json_object(d, "tokenizer_config.json");
  std::optional<JsonFile> map;
  if (d.has("special_tokens_map.json")) map = read_json_object(d, "special_tokens_map.json");

  const std::optional<std::string> cls = string_field(config, "tokenizer_class");
  if (!cls) throw TokenizerError(str_cat(config.label, ": 'tokenizer_class' is missing"));
  if (*cls == "Qwen2Tokenizer" || *cls == "Qwen2TokenizerFast") {
    style_ = Flux2TextStyle::Qwen3;
  } else if (*cls == "LlamaTokenizer" || *cls == "LlamaTokenizerFast") {
    std::optional<std::string> processor = string_field(config, "processor_class");
    if (d.has("processor_config.json") && processor != "PixtralProcessor")
      processor = string_field(read_json_object(d, "processor_config.json"), "processor_class");
    if (processor != "PixtralProcessor")
      throw TokenizerError(str_cat(d.label, ": tokenizer_class '", *cls, "' without a PixtralProcessor (processor_class ",
                                   "in processor_config.json or tokenizer_config.json) is not a FLUX.2 [dev] tokenizer"));
    style_ = Flux2TextStyle::Mistral;
  } else {
    throw TokenizerError(str_cat(config.label, ": tokenizer_class '", *cls,
                                 "' is not a FLUX.2 tokenizer (Qwen2TokenizerFast for klein, a PixtralProcessor's ",
                                 "LlamaTokenizerFast for dev)"));
  }

  // special_tokens_map.json wins over tokenizer_config.json, as in transformers.
  auto special = [&](const char* key) -> std::optional<std::pair<std::string, const JsonFile*>> {
    const JsonFile* files[] = {map ? &*map : nullptr, &config};
    for (const JsonFile* f : files) {
      if (f == nullptr) continue;
      if (std::optional<std::string> t = special_token(*f, key)) return std::make_pair(*t, f);
    }
    return std::nullopt;
  };
  const auto pad = special("pad_token");
  if (!pad)
    throw TokenizerError(str_cat(d.label, ": no 'pad_token' in ", map ? "special_tokens_map.json or " : "",
                                 "tokenizer_config.json (FLUX.2 pads every prompt to max_sequence_length)"));
  const std::optional<int64_t> pad_id = bpe_.token_to_id(pad->first);
  if (!pad_id)
    throw TokenizerError(str_cat(pad->second->label, ": 'pad_token' \"", pad->first, "\" is not a token of ",
                                 bpe_.file_label()));
  pad_id_ = *pad_id;

  if (style_ == Flux2TextStyle::Mistral) {
    const auto bos = special("bos_token");
    if (!bos) throw TokenizerError(str_cat(config.label, ": 'bos_token' is missing (the dev chat template starts with it)"));
    if (!bpe_.token_to_id(bos->first))
      throw TokenizerError(str_cat(bos->second->label, ": 'bos_token' \"", bos->first, "\" is not a token of ",
                                   bpe_.file_label()));
    bos_token_ = bos->first;
  }
  // The chat templates rely on their special tokens being split out of the text.
  if (auto split = config.json.find("split_special_tokens"); split != config.json.end() && *split == true)
    throw TokenizerError(str_cat(config.label, ": 'split_special_tokens' true is not supported (the chat template's ",
                                 "special tokens would be tokenised as text)"));
  // The tokenizer classes' defaults: LlamaTokenizerFast pads on the left, Qwen2 on the right.
  pads_left_ = left_side(config, "padding_side", style_ == Flux2TextStyle::Mistral);
  truncates_left_ = left_side(config, "truncation_side", false);
}

std::string flux2_chat_text(const Flux2Tokenizer& tok, const std::string& prompt) {
  if (tok.style() == Flux2TextStyle::Qwen3) {
    // add_generation_prompt=True, enable_thinking=False: an empty thinking block closes the turn.
    return "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  }
  // diffusers removes [IMG] so that the processor finds no image placeholders to expand.
  return tok.bos_token() + "[SYSTEM_PROMPT]" + kFlux2SystemMessage + "[/SYSTEM_PROMPT][INST]" +
         replace_all(prompt, "[IMG]", "") + "[/INST]";
}

PromptTokens tokenize_flux2_prompt(const Flux2Tokenizer& tok, const std::string& prompt, int64_t max_length) {
  FLUX_CHECK_AS(UsageError, max_length >= 1, "max_sequence_length must be at least 1, got ", max_length);
  check_utf8(prompt, "prompt");
  std::vector<int64_t> content = tok.bpe().encode(flux2_chat_text(tok, prompt));
  PromptTokens t;
  t.num_tokens = static_cast<int64_t>(content.size());
  t.real_tokens = std::min(t.num_tokens, max_length);
  const auto cut = static_cast<size_t>(t.num_tokens - t.real_tokens);
  if (tok.truncates_left()) {
    content.erase(content.begin(), content.begin() + static_cast<std::ptrdiff_t>(cut));
  } else {
    content.resize(static_cast<size_t>(t.real_tokens));
  }
  const auto pad = static_cast<size_t>(max_length - t.real_tokens);
  t.ids.reserve(static_cast<size_t>(max_length));
  t.mask.reserve(static_cast<size_t>(max_length));
  if (tok.pads_left()) {
    t.ids.assign(pad, tok.pad_id());
    t.mask.assign(pad, 0);
  }
  t.ids.insert(t.ids.end(), content.begin(), content.end());
  t.mask.insert(t.mask.end(), content.size(), 1);
  if (!tok.pads_left()) {
    t.ids.resize(static_cast<size_t>(max_length), tok.pad_id());
    t.mask.resize(static_cast<size_t>(max_length), 0);
  }
  return t;
}

}  // namespace fluxmpi::text
