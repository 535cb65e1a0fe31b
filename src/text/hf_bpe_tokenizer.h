#pragma once
/// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (the tokenizers of the
/// FLUX.2 text encoders: Qwen2/Qwen3 and Mistral Tekken).
// Semantics of HF tokenizers: AddedVocabulary split, NFC normalizer, Split/ByteLevel
// pre-tokenizers, BPE model with ignore_merges. Only what those tokenizers use is accepted;
// anything else is refused by name rather than approximated.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fluxmpi::text {

class HfBpeTokenizer {
 public:
  /// Reads `dir`/tokenizer.json. `label` names the folder in error messages ("model dir '/m':
  /// tokenizer"); empty: the path. Throws TokenizerError naming the file and the field for a
  /// missing or malformed file and for any feature this reader does not implement.
  explicit HfBpeTokenizer(const std::string& dir, const std::string& label = "");
  HfBpeTokenizer(HfBpeTokenizer&&) noexcept;
  HfBpeTokenizer& operator=(HfBpeTokenizer&&) noexcept;
  ~HfBpeTokenizer();

  /// The ids of `text`, without any special token added (HF add_special_tokens=False): added
  /// tokens written in the text are split out first (leftmost-longest, even inside user text),
  /// the rest is normalised, pre-tokenised and BPE-merged. UsageError for invalid UTF-8.
  std::vector<int64_t> encode(const std::string& text) const;
  /// The same as token strings ("Ġphoto", "<|im_end|>").
  std::vector<std::string> tokenize(const std::string& text) const;

  /// The id of an added token or vocabulary entry (added tokens first, as HF does).
  std::optional<int64_t> token_to_id(const std::string& token) const;
  /// The token of `id`; nullopt for an id that neither the vocabulary nor the added tokens use.
  std::optional<std::string> id_to_token(int64_t id) const;
  /// One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const;
  /// How tokenizer.json is named in messages ("<label>/tokenizer.json").
  const std::string& file_label() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxmpi::text
