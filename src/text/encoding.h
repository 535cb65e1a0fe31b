#pragma once
/// The result of tokenizing one prompt, shared by the CLIP and T5 tokenizers.

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi::text {

struct Encoding {
  /// Exactly max_length ids: specials, the kept content tokens, then padding.
  std::vector<int64_t> ids;
  /// Content tokens of the whole prompt, before truncation (no BOS/EOS/padding).
  int64_t num_tokens = 0;
  /// True when content tokens did not fit and were cut off.
  bool truncated = false;
  /// The part of the prompt that was cut off, quoted from the original text (from the first
  /// character of the first dropped token to the last character of the last token); empty when
  /// nothing was cut. A character whose bytes are split between a kept and a dropped token is
  /// quoted whole.
  std::string dropped;
};

/// Lays out `content` as [bos] + content[:room] + [eos] + pad... with exactly `max_length` ids,
/// where room = max_length - 1 - (bos >= 0). `bos` < 0 means no BOS. Sets ids, num_tokens and
/// truncated; `dropped` is left to the caller, which knows the text.
Encoding lay_out(const std::vector<int64_t>& content, int64_t bos, int64_t eos, int64_t pad, int64_t max_length);

/// Throws TokenizerError "<label>: max_length must be at least 2 ..." for max_length < 2.
void check_max_length(int64_t max_length, const std::string& label);

/// Throws UsageError naming `what` and the byte offset when `text` is not valid UTF-8.
void check_utf8(const std::string& text, const std::string& what);

/// `text` without leading and trailing Unicode white space (White_Space property).
std::string trim_white_space(const std::string& text);

}  // namespace fluxmpi::text
