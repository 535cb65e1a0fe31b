#pragma once
/// CLIP's text front end, shared by the tokenizer and the BPE trainer: normalisation (NFC, white
/// space runs folded to one space and stripped, full Unicode lower-casing), the pre-split into
/// words, and the byte-level alphabet. Every word remembers which characters of the original
/// prompt it came from, so that truncation can quote the user's own text.
// Semantics of HF CLIPTokenizerFast's normaliser and pre-tokenizer (= OpenAI simple_tokenizer).

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fluxmpi::text {

/// A byte range [begin, end) of the original prompt.
struct Span {
  size_t begin = 0;
  size_t end = 0;
};

/// One word of the pre-split.
struct ClipWord {
  /// The normalised word (UTF-8).
  std::string text;
  /// For each byte of `text`: the whole original characters it derives from.
  std::vector<Span> source;
};

/// NFC -> white-space runs to ' ' -> strip -> lower-case -> split into words by
///   <literals> | 's | 't | 're | 've | 'm | 'll | 'd | \p{L}+ | \p{N} | [^\s\p{L}\p{N}]+
/// (case-insensitive), where white space is the Unicode White_Space property.
class ClipPreSplitter {
 public:
  /// `literals` are matched as whole words before the other rules (CLIP's special tokens).
  explicit ClipPreSplitter(const std::vector<std::string>& literals);
  ClipPreSplitter(ClipPreSplitter&&) noexcept;
  ClipPreSplitter& operator=(ClipPreSplitter&&) noexcept;
  ~ClipPreSplitter();

  /// Splits `text` (valid UTF-8; UsageError otherwise).
  std::vector<ClipWord> split(const std::string& text) const;
  /// The normalised text the words are cut from (for tests and docs).
  std::string normalize(const std::string& text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The byte-level alphabet of GPT-2 and CLIP: the printable symbol (UTF-8) that stands for each
/// byte value, so that BPE works on text without control characters or spaces.
const std::array<std::string, 256>& byte_symbols();
/// Byte values in the order CLIP's vocabulary lists their symbols ('!'..'~', '¡'..'¬', '®'..'ÿ',
/// then the remaining bytes in increasing order).
const std::array<uint8_t, 256>& byte_symbol_order();
/// The suffix CLIP puts on the last symbol of a word.
inline constexpr const char* kEndOfWord = "</w>";

}  // namespace fluxmpi::text
