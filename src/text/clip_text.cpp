#include "text/clip_text.h"

#include <cctype>
#include <cstdio>

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/edits.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

#include "core/error.h"
#include "text/encoding.h"

namespace fluxmpi::text {
namespace {

// Text plus, for each of its bytes, the original characters it derives from. Spans never
// decrease along the text, which lets a run of bytes map to one covering span.
struct Tracked {
  std::string text;
  std::vector<Span> source;
};

Span cover(const std::vector<Span>& source, size_t begin, size_t end) {
  if (begin < end) return {source[begin].begin, source[end - 1].end};
  // An insertion: a point between characters.
  const size_t at = begin < source.size() ? source[begin].begin : (source.empty() ? 0 : source.back().end);
  return {at, at};
}

UChar32 next_code_point(const std::string& s, int32_t& i) {
  UChar32 c;
  U8_NEXT(reinterpret_cast<const uint8_t*>(s.data()), i, static_cast<int32_t>(s.size()), c);
  return c;
}

Tracked track_original(const std::string& text) {
  Tracked t{text, std::vector<Span>(text.size())};
  for (int32_t i = 0; i < static_cast<int32_t>(text.size());) {
    const int32_t start = i;
    next_code_point(text, i);
    for (int32_t k = start; k < i; ++k) t.source[k] = {static_cast<size_t>(start), static_cast<size_t>(i)};
  }
  return t;
}

void check_icu(UErrorCode status, const char* what) {
  if (U_FAILURE(status)) throw InternalError(str_cat("ICU ", what, " failed: ", u_errorName(status)));
}

// `out` is `in.text` transformed by ICU, with the transformation recorded in `edits`.
Tracked follow_edits(const Tracked& in, std::string out, const icu::Edits& edits) {
  Tracked t{std::move(out), {}};
  t.source.resize(t.text.size());
  UErrorCode status = U_ZERO_ERROR;
  icu::Edits::Iterator it = edits.getFineIterator();
  while (it.next(status)) {
    const auto src = static_cast<size_t>(it.sourceIndex());
    const auto dst = static_cast<size_t>(it.destinationIndex());
    const auto old_len = static_cast<size_t>(it.oldLength());
    const auto new_len = static_cast<size_t>(it.newLength());
    if (!it.hasChange()) {
      for (size_t k = 0; k < new_len; ++k) t.source[dst + k] = in.source[src + k];
    } else {
      const Span s = cover(in.source, src, src + old_len);
      for (size_t k = 0; k < new_len; ++k) t.source[dst + k] = s;
    }
  }
  check_icu(status, "edit tracking");
  return t;
}

Tracked to_nfc(const Tracked& in) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  check_icu(status, "NFC instance");
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  icu::Edits edits;
  nfc->normalizeUTF8(0, in.text, sink, &edits, status);
  check_icu(status, "NFC normalisation");
  return follow_edits(in, std::move(out), edits);
}

// The root locale's full lower-casing (final sigma, 'İ' -> "i̇"), as Python's str.lower().
Tracked to_lower(const Tracked& in) {
  UErrorCode status = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  icu::Edits edits;
  icu::CaseMap::utf8ToLower("", 0, in.text, sink, &edits, status);
  check_icu(status, "lower-casing");
  return follow_edits(in, std::move(out), edits);
}

Tracked fold_white_space(const Tracked& in) {
  Tracked t;
  t.text.reserve(in.text.size());
  t.source.reserve(in.text.size());
  bool in_run = false;
  size_t run_begin = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(in.text.size());) {
    const int32_t start = i;
    const UChar32 c = next_code_point(in.text, i);
    if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) {
      if (!in_run) run_begin = static_cast<size_t>(start);
      in_run = true;
      continue;
    }
    if (in_run && !t.text.empty()) {  // a leading run is stripped
      t.text.push_back(' ');
      t.source.push_back(cover(in.source, run_begin, static_cast<size_t>(start)));
    }
    in_run = false;
    t.text.append(in.text, static_cast<size_t>(start), static_cast<size_t>(i - start));
    t.source.insert(t.source.end(), in.source.begin() + start, in.source.begin() + i);
  }
  return t;  // a trailing run was never emitted
}

Tracked normalize_tracked(const std::string& text) {
  check_utf8(text, "prompt");
  return to_lower(fold_white_space(to_nfc(track_original(text))));
}

// `text` as a regex literal: every character but ASCII letters and digits as \x{...}.
std::string regex_literal(const std::string& text) {
  std::string out;
  for (int32_t i = 0; i < static_cast<int32_t>(text.size());) {
    const UChar32 c = next_code_point(text, i);
    if (c < 0) throw TokenizerError(str_cat("special token '", text, "' is not valid UTF-8"));
    if (c < 128 && std::isalnum(c)) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\x{%X}", static_cast<unsigned>(c));
      out += buf;
    }
  }
  return out;
}

}  // namespace

struct ClipPreSplitter::Impl {
  std::unique_ptr<icu::RegexPattern> pattern;
};

ClipPreSplitter::ClipPreSplitter(const std::vector<std::string>& literals) : impl_(std::make_unique<Impl>()) {
  std::string re;
  for (const std::string& l : literals) {
    if (l.empty()) continue;
    re += regex_literal(l) + "|";
  }
  re += "'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\p{White_Space}\\p{L}\\p{N}]+";
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error;
  impl_->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(re), UREGEX_CASE_INSENSITIVE,
                                                  parse_error, status));
  check_icu(status, "regex compilation");
}

ClipPreSplitter::ClipPreSplitter(ClipPreSplitter&&) noexcept = default;
ClipPreSplitter& ClipPreSplitter::operator=(ClipPreSplitter&&) noexcept = default;
ClipPreSplitter::~ClipPreSplitter() = default;

std::string ClipPreSplitter::normalize(const std::string& text) const { return normalize_tracked(text).text; }

std::vector<ClipWord> ClipPreSplitter::split(const std::string& text) const {
  const Tracked t = normalize_tracked(text);
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(impl_->pattern->matcher(status));
  check_icu(status, "regex matcher");
  // A UTF-8 UText makes the match positions byte offsets into t.text.
  UText* ut = utext_openUTF8(nullptr, t.text.data(), static_cast<int64_t>(t.text.size()), &status);
  check_icu(status, "UText");
  matcher->reset(ut);
  std::vector<ClipWord> words;
  while (matcher->find()) {
    const auto begin = static_cast<size_t>(matcher->start64(status));
    const auto end = static_cast<size_t>(matcher->end64(status));
    if (U_FAILURE(status) || begin >= end) break;
    words.push_back({t.text.substr(begin, end - begin),
                     std::vector<Span>(t.source.begin() + begin, t.source.begin() + end)});
  }
  utext_close(ut);
  check_icu(status, "regex matching");
  return words;
}

const std::array<uint8_t, 256>& byte_symbol_order() {
  static const std::array<uint8_t, 256> order = [] {
    std::array<uint8_t, 256> o{};
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    size_t n = 0;
    for (int b = 0; b < 256; ++b)
      if (printable(b)) o[n++] = static_cast<uint8_t>(b);
    for (int b = 0; b < 256; ++b)
      if (!printable(b)) o[n++] = static_cast<uint8_t>(b);
    return o;
  }();
  return order;
}

const std::array<std::string, 256>& byte_symbols() {
  static const std::array<std::string, 256> symbols = [] {
    // Printable bytes stand for themselves (as code points); the others take the code points
    // 256, 257, ... in byte order.
    std::array<std::string, 256> s;
    UChar32 next_extra = 256;
    for (int i = 0; i < 256; ++i) {
      const uint8_t b = byte_symbol_order()[i];
      const bool printable = i < 188;  // '!'..'~' (94) + '¡'..'¬' (12) + '®'..'ÿ' (82)
      const UChar32 c = printable ? static_cast<UChar32>(b) : next_extra++;
      char buf[4];
      int32_t len = 0;
      UBool error = false;
      U8_APPEND(reinterpret_cast<uint8_t*>(buf), len, 4, c, error);
      FLUX_CHECK(!error, "byte symbol U+", c, " does not encode");
      s[b].assign(buf, static_cast<size_t>(len));
    }
    return s;
  }();
  return symbols;
}

}  // namespace fluxmpi::text
