#pragma once
/// The T5 sentencepiece tokenizer of FLUX's second text encoder (tokenizer_2/spiece.model).
// Semantics of HF T5Tokenizer (legacy=True): sentencepiece pieces, then </s>, padded with <pad>.

#include <cstdint>
#include <string>
#include <vector>

#include "text/encoding.h"
#include "text/sentencepiece_loader.h"

namespace fluxmpi::text {

class T5Tokenizer {
 public:
  /// Loads `dir`/spiece.model. EOS and PAD are the model's own (</s> = 1, <pad> = 0 for T5);
  /// when special_tokens_map.json or tokenizer_config.json are present, their eos_token,
  /// pad_token and unk_token must name the same pieces. `label` names the folder in error
  /// messages (ModelDir::label("tokenizer_2")); empty: the path. Throws TokenizerError.
  explicit T5Tokenizer(const std::string& dir, const std::string& label = "");

  /// pieces[:max_length - 1] + [EOS], padded with PAD to `max_length` (>= 2, TokenizerError
  /// otherwise); FluxPipeline's max_sequence_length (256 or 512).
  Encoding encode(const std::string& text, int64_t max_length) const;
  /// All sentencepiece pieces of `text` ("▁photo"), untruncated, no EOS.
  std::vector<std::string> pieces(const std::string& text) const;

  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  /// Pieces in spiece.model (32000 for T5; the encoder's embedding table may be larger).
  int64_t vocab_size() const { return sp_.vocab_size(); }
  const std::string& label() const { return label_; }

 private:
  std::string label_;
  SentencePieceModel sp_;
  int64_t eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
};

}  // namespace fluxmpi::text
