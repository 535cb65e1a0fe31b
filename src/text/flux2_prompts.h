#pragma once
/// What the FLUX.2 pipelines give their text encoder: the prompt rendered in the encoder's chat
/// template, tokenised, truncated and padded to max_sequence_length, with its attention mask.
// Semantics of diffusers 0.40 Flux2KleinPipeline._get_qwen3_prompt_embeds (Qwen3 chat template,
// right padding) and Flux2Pipeline._get_mistral_3_small_prompt_embeds (format_text_input with
// SYSTEM_MESSAGE, PixtralProcessor chat template, LlamaTokenizerFast's left padding).

#include <cstdint>
#include <string>

#include "text/hf_bpe_tokenizer.h"

namespace fluxmpi::text {

/// Which text encoder the tokenizer belongs to.
enum class Flux2TextStyle {
  Qwen3,    ///< FLUX.2 [klein]: Qwen2TokenizerFast
  Mistral,  ///< FLUX.2 [dev]: PixtralProcessor around a LlamaTokenizerFast (Tekken)
};
const char* to_string(Flux2TextStyle style);

/// The pipelines' default max_sequence_length.
inline constexpr int64_t kFlux2MaxSequenceLength = 512;

/// The system message of FLUX.2 [dev] (diffusers pipelines/flux2/system_messages.py; note its
/// line break between "object" and "attribution").
extern const char* const kFlux2SystemMessage;

/// A pipeline's tokenizer/ folder: tokenizer.json plus the special tokens and sides that
/// tokenizer_config.json (and special_tokens_map.json, which wins, as in transformers) give.
class Flux2Tokenizer {
 public:
  /// Reads `dir`. The style comes from tokenizer_config.json's tokenizer_class
  /// (Qwen2Tokenizer[Fast] -> Qwen3; LlamaTokenizer[Fast] with a PixtralProcessor named in
  /// processor_config.json or tokenizer_config.json -> Mistral). `label` names the folder in
  /// errors; empty: the path. TokenizerError naming the file and the field for bad input.
  explicit Flux2Tokenizer(const std::string& dir, const std::string& label = "");

  Flux2TextStyle style() const { return style_; }
  const HfBpeTokenizer& bpe() const { return bpe_; }
  /// The id of pad_token.
  int64_t pad_id() const { return pad_id_; }
  /// bos_token (Mistral's template starts with it); empty for Qwen3, which has none.
  const std::string& bos_token() const { return bos_token_; }
  /// padding_side / truncation_side: tokenizer_config.json's, else the tokenizer class's
  /// default (Qwen2: right; Llama: left; truncation: right for both).
  bool pads_left() const { return pads_left_; }
  bool truncates_left() const { return truncates_left_; }

 private:
  HfBpeTokenizer bpe_;
  Flux2TextStyle style_ = Flux2TextStyle::Qwen3;
  int64_t pad_id_ = -1;
  std::string bos_token_;
  bool pads_left_ = false;
  bool truncates_left_ = false;
};

/// The chat text the pipeline tokenises for `prompt`:
///   Qwen3:   <|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
///   Mistral: {bos}[SYSTEM_PROMPT]{kFlux2SystemMessage}[/SYSTEM_PROMPT][INST]{prompt without [IMG]}[/INST]
std::string flux2_chat_text(const Flux2Tokenizer& tok, const std::string& prompt);

struct PromptTokens {
  /// Exactly max_length ids: the chat text's tokens (cut to max_length) and padding.
  std::vector<int64_t> ids;
  /// 1 for a real token, 0 for padding; same length as ids.
  std::vector<int64_t> mask;
  /// Real tokens kept (= sum of mask).
  int64_t real_tokens = 0;
  /// Tokens of the whole chat text before truncation.
  int64_t num_tokens = 0;
  bool truncated() const { return num_tokens > real_tokens; }
};

/// Renders `prompt` with flux2_chat_text, encodes it without adding special tokens, truncates
/// and pads it to `max_length` on the tokenizer's sides. UsageError for max_length < 1 or a
/// prompt that is not valid UTF-8.
PromptTokens tokenize_flux2_prompt(const Flux2Tokenizer& tok, const std::string& prompt,
                                   int64_t max_length = kFlux2MaxSequenceLength);

}  // namespace fluxmpi::text
