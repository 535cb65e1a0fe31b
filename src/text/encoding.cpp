#include "text/encoding.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include "core/error.h"

namespace fluxmpi::text {

Encoding lay_out(const std::vector<int64_t>& content, int64_t bos, int64_t eos, int64_t pad, int64_t max_length) {
  const int64_t specials = bos >= 0 ? 2 : 1;
  FLUX_CHECK(max_length >= specials, "max_length ", max_length, " leaves no room for the special tokens");
  const int64_t room = max_length - specials;
  Encoding e;
  e.num_tokens = static_cast<int64_t>(content.size());
  e.truncated = e.num_tokens > room;
  const int64_t kept = e.truncated ? room : e.num_tokens;
  e.ids.reserve(static_cast<size_t>(max_length));
  if (bos >= 0) e.ids.push_back(bos);
  e.ids.insert(e.ids.end(), content.begin(), content.begin() + kept);
  e.ids.push_back(eos);
  e.ids.resize(static_cast<size_t>(max_length), pad);
  return e;
}

void check_max_length(int64_t max_length, const std::string& label) {
  if (max_length < 2)
    throw TokenizerError(str_cat(label, ": max_length must be at least 2 (one special token and one content token), got ",
                                 max_length));
}

void check_utf8(const std::string& text, const std::string& what) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t n = static_cast<int32_t>(text.size());
  FLUX_CHECK_AS(UsageError, text.size() < 0x7fffffffu, what, " is too long (", text.size(), " bytes)");
  for (int32_t i = 0; i < n;) {
    const int32_t at = i;
    UChar32 c;
    U8_NEXT(s, i, n, c);
    if (c < 0) throw UsageError(str_cat(what, " is not valid UTF-8 (bad byte at offset ", at, ")"));
  }
}

std::string trim_white_space(const std::string& text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t n = static_cast<int32_t>(text.size());
  int32_t begin = 0;
  while (begin < n) {
    int32_t next = begin;
    UChar32 c;
    U8_NEXT(s, next, n, c);
    if (c < 0 || !u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) break;
    begin = next;
  }
  int32_t end = n;
  while (end > begin) {
    int32_t prev = end;
    UChar32 c;
    U8_PREV(s, 0, prev, c);
    if (c < 0 || !u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) break;
    end = prev;
  }
  return text.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

}  // namespace fluxmpi::text
