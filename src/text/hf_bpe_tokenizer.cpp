#include "text/hf_bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

#include "core/error.h"
#include "text/clip_text.h"
#include "text/encoding.h"
#include "text/tokenizer_files.h"

namespace fluxmpi::text {
namespace {
using json = nlohmann::json;

// GPT-2's split, which the ByteLevel pre-tokenizer applies itself when use_regex is true.
constexpr const char* kGpt2Split = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct AddedToken {
  std::string content;  ///< as matched: normalised for `normalized` tokens
  int32_t id;
};

// Added tokens grouped by their first byte, longest first, so that the first one that matches
// at a position is the longest there (aho-corasick's LeftmostLongest in HF).
using AddedIndex = std::array<std::vector<AddedToken>, 256>;

struct PreStep {
  enum class Kind { Split, ByteLevel } kind;
  std::unique_ptr<icu::RegexPattern> regex;  ///< Split: its pattern; ByteLevel: GPT-2's or none
};

struct Merge {
  int32_t rank;
  int32_t id;
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

void check_icu(UErrorCode status, const char* what) {
  if (U_FAILURE(status)) throw InternalError(str_cat("ICU ", what, " failed: ", u_errorName(status)));
}

// `piece` cut into the matches of `re` and the text between them (HF Split, behavior Isolated);
// empty pieces are dropped.
void split_isolated(const icu::RegexPattern& re, const std::string& piece, std::vector<std::string>& out) {
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(re.matcher(status));
  check_icu(status, "regex matcher");
  // A UTF-8 UText makes the match positions byte offsets into `piece`.
  UText* ut = utext_openUTF8(nullptr, piece.data(), static_cast<int64_t>(piece.size()), &status);
  check_icu(status, "UText");
  matcher->reset(ut);
  size_t last = 0;
  while (matcher->find()) {
    const auto begin = static_cast<size_t>(matcher->start64(status));
    const auto end = static_cast<size_t>(matcher->end64(status));
    if (U_FAILURE(status)) break;
    if (begin == end) continue;
    if (begin > last) out.push_back(piece.substr(last, begin - last));
    out.push_back(piece.substr(begin, end - begin));
    last = end;
  }
  utext_close(ut);
  check_icu(status, "regex matching");
  if (last < piece.size()) out.push_back(piece.substr(last));
}

std::string to_byte_symbols(const std::string& piece) {
  std::string out;
  out.reserve(piece.size() * 2);
  for (char ch : piece) out += byte_symbols()[static_cast<uint8_t>(ch)];
  return out;
}

std::string nfc(const std::string& text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  check_icu(status, "NFC instance");
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, text, sink, nullptr, status);
  check_icu(status, "NFC normalisation");
  return out;
}

// Reads the fields of tokenizer.json, each error naming the file and the JSON path.
class Reader {
 public:
  explicit Reader(std::string label) : label_(std::move(label)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    const std::string sep = path.empty() || what.empty() ? "" : ": ";
    throw TokenizerError(str_cat(label_, ": ", path, sep, what));
  }
  const json& at(const json& obj, const std::string& path, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(str_cat(path, path.empty() ? "" : ".", key), "missing");
    return *it;
  }
  std::string string_at(const json& obj, const std::string& path, const char* key) const {
    const json& v = at(obj, path, key);
    if (!v.is_string()) fail(str_cat(path, path.empty() ? "" : ".", key), str_cat("must be a string, got ", v.dump()));
    return v.get<std::string>();
  }
  bool bool_at(const json& obj, const std::string& path, const char* key, bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(str_cat(path, ".", key), str_cat("must be true or false, got ", it->dump()));
    return it->get<bool>();
  }
  // A field that must be absent, null or `expected` (features this reader does not implement).
  template <typename T>
  void require_value(const json& obj, const std::string& path, const char* key, const T& expected,
                     const char* why) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null() || *it == json(expected)) return;
    fail(str_cat(path, ".", key), str_cat(it->dump(), " is not supported (", why, ")"));
  }
  const std::string& label() const { return label_; }

 private:
  std::string label_;
};

}  // namespace

struct HfBpeTokenizer::Impl {
  std::string label;
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<int32_t, std::string> tokens_by_id;
  std::unordered_map<uint64_t, Merge> merges;  ///< (left id << 32 | right id) -> rank, merged id
  bool ignore_merges = false;
  bool use_nfc = false;
  std::vector<PreStep> pre_steps;
  AddedIndex raw_added;         ///< normalized: false, matched on the text as given
  AddedIndex normalized_added;  ///< normalized: true, matched on the normalised text
  bool any_normalized_added = false;
  std::unordered_map<std::string, int32_t> added_ids;
  int32_t max_id = -1;

  void load(const json& root, const Reader& r);
  void load_model(const json& model, const Reader& r);
  void load_merges(const json& merges, const Reader& r);
  void load_normalizer(const json& n, const Reader& r);
  void load_pre_tokenizer(const json& p, const std::string& path, const Reader& r);
  void load_added_tokens(const json& added, const Reader& r);
  std::unique_ptr<icu::RegexPattern> compile(const std::string& pattern, bool literal, const std::string& path,
                                             const Reader& r) const;

  void split_added(const std::string& text, const AddedIndex& index, std::vector<std::pair<std::string, int32_t>>& out)
      const;
  std::vector<std::string> pre_tokenize(const std::string& text) const;
  void bpe(const std::string& piece, std::vector<int64_t>& ids) const;
  int32_t symbol_id(const std::string& symbol) const;
};

HfBpeTokenizer::HfBpeTokenizer(const std::string& dir, const std::string& label) : impl_(std::make_unique<Impl>()) {
  const TokenizerDir d{dir, label.empty() ? dir : label};
  impl_->label = d.file_label("tokenizer.json");
  const Reader r(impl_->label);
  const std::string text = read_tokenizer_file(d, "tokenizer.json");
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw TokenizerError(str_cat(impl_->label, ": not valid JSON (truncated or corrupt?): ", e.what()));
  }
  if (!root.is_object()) throw TokenizerError(str_cat(impl_->label, ": not a JSON object"));
  impl_->load(root, r);
}

HfBpeTokenizer::HfBpeTokenizer(HfBpeTokenizer&&) noexcept = default;
HfBpeTokenizer& HfBpeTokenizer::operator=(HfBpeTokenizer&&) noexcept = default;
HfBpeTokenizer::~HfBpeTokenizer() = default;

void HfBpeTokenizer::Impl::load(const json& root, const Reader& r) {
  const json& model = r.at(root, "", "model");
  if (!model.is_object()) r.fail("model", "must be an object");
  load_model(model, r);
  auto n = root.find("normalizer");
  if (n != root.end() && !n->is_null()) load_normalizer(*n, r);
  const json& pre = r.at(root, "", "pre_tokenizer");
  if (pre.is_null()) r.fail("pre_tokenizer", "null: only byte-level BPE (a ByteLevel pre-tokenizer) is supported");
  load_pre_tokenizer(pre, "pre_tokenizer", r);
  const auto byte_levels = std::count_if(pre_steps.begin(), pre_steps.end(),
                                         [](const PreStep& s) { return s.kind == PreStep::Kind::ByteLevel; });
  if (byte_levels != 1)
    r.fail("pre_tokenizer", str_cat("has ", byte_levels, " ByteLevel steps; byte-level BPE needs exactly one"));
  auto added = root.find("added_tokens");
  if (added != root.end() && !added->is_null()) load_added_tokens(*added, r);
}

void HfBpeTokenizer::Impl::load_model(const json& model, const Reader& r) {
  const std::string type = r.string_at(model, "model", "type");
  if (type != "BPE") r.fail("", str_cat("model type '", type, "' is not BPE"));
  r.require_value(model, "model", "dropout", 0.0, "dropout makes encoding random");
  r.require_value(model, "model", "continuing_subword_prefix", "", "byte-level BPE uses none");
  r.require_value(model, "model", "end_of_word_suffix", "", "byte-level BPE uses none");
  r.require_value(model, "model", "byte_fallback", false, "byte-level BPE needs no fallback");
  ignore_merges = r.bool_at(model, "model", "ignore_merges", false);

  const json& v = r.at(model, "model", "vocab");
  if (!v.is_object() || v.empty()) r.fail("model.vocab", "must be a non-empty object mapping tokens to ids");
  vocab.reserve(v.size());
  tokens_by_id.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    const json& id = it.value();
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      r.fail("model.vocab", str_cat("token \"", it.key(), "\" must map to a non-negative integer id, got ", id.dump()));
    const auto i = static_cast<int32_t>(id.get<int64_t>());
    auto [other, fresh] = tokens_by_id.emplace(i, it.key());
    if (!fresh) r.fail("model.vocab", str_cat("id ", i, " is used by both \"", other->second, "\" and \"", it.key(), "\""));
    vocab.emplace(it.key(), i);
    max_id = std::max(max_id, i);
  }
  // Every byte is a symbol of byte-level BPE, so no character can be unknown.
  for (int b = 0; b < 256; ++b)
    if (vocab.find(byte_symbols()[b]) == vocab.end())
      r.fail("model.vocab", str_cat("the byte symbol \"", byte_symbols()[b], "\" (byte ", b,
                                    ") is missing; a byte-level BPE vocabulary lists all 256"));
  load_merges(r.at(model, "model", "merges"), r);
}

void HfBpeTokenizer::Impl::load_merges(const json& m, const Reader& r) {
  if (!m.is_array()) r.fail("model.merges", "must be a list");
  merges.reserve(m.size());
  for (size_t rank = 0; rank < m.size(); ++rank) {
    const json& e = m[rank];
    const std::string path = str_cat("model.merges[", rank, "]");
    std::string left, right;
    // Two spellings: "a b" (older files) and ["a", "b"] (tokenizers >= 0.20).
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size() || s.find(' ', space + 1) != std::string::npos)
        r.fail(path, str_cat("expected two symbols separated by one space, got \"", s, "\""));
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      r.fail(path, str_cat("must be \"a b\" or [\"a\", \"b\"], got ", e.dump()));
    }
    for (const std::string& sym : {left, right, left + right})
      if (vocab.find(sym) == vocab.end()) r.fail(path, str_cat("symbol \"", sym, "\" is not in model.vocab"));
    // A pair listed twice keeps its later rank, as HF's map does.
    merges[pair_key(vocab.at(left), vocab.at(right))] = Merge{static_cast<int32_t>(rank), vocab.at(left + right)};
  }
}

void HfBpeTokenizer::Impl::load_normalizer(const json& n, const Reader& r) {
  if (!n.is_object()) r.fail("normalizer", str_cat("must be null or an object, got ", n.dump()));
  const std::string type = r.string_at(n, "normalizer", "type");
  if (type != "NFC") r.fail("normalizer", str_cat("type '", type, "' is not supported (only null or NFC)"));
  use_nfc = true;
}

std::unique_ptr<icu::RegexPattern> HfBpeTokenizer::Impl::compile(const std::string& pattern, bool literal,
                                                                 const std::string& path, const Reader& r) const {
  UErrorCode status = U_ZERO_ERROR;
  UParseError where;
  std::unique_ptr<icu::RegexPattern> re(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), literal ? UREGEX_LITERAL : 0, where, status));
  if (U_FAILURE(status))
    r.fail(path, str_cat("regex \"", pattern, "\" does not compile (", u_errorName(status), " at offset ",
                         where.offset, ")"));
  return re;
}

void HfBpeTokenizer::Impl::load_pre_tokenizer(const json& p, const std::string& path, const Reader& r) {
  if (!p.is_object()) r.fail(path, str_cat("must be an object, got ", p.dump()));
  const std::string type = r.string_at(p, path, "type");
  if (type == "Sequence") {
    const json& steps = r.at(p, path, "pretokenizers");
    if (!steps.is_array()) r.fail(path + ".pretokenizers", "must be a list");
    for (size_t i = 0; i < steps.size(); ++i) load_pre_tokenizer(steps[i], str_cat(path, ".pretokenizers[", i, "]"), r);
  } else if (type == "Split") {
    const json& pattern = r.at(p, path, "pattern");
    const bool is_regex = pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string();
    const bool is_string = pattern.is_object() && pattern.contains("String") && pattern["String"].is_string();
    if (!is_regex && !is_string)
      r.fail(path + ".pattern", str_cat("must be {\"Regex\": ...} or {\"String\": ...}, got ", pattern.dump()));
    const std::string behavior = r.string_at(p, path, "behavior");
    if (behavior != "Isolated") r.fail(path + ".behavior", str_cat("'", behavior, "' is not supported (only Isolated)"));
    if (r.bool_at(p, path, "invert", false)) r.fail(path + ".invert", "true is not supported");
    const std::string text = is_regex ? pattern["Regex"].get<std::string>() : pattern["String"].get<std::string>();
    pre_steps.push_back({PreStep::Kind::Split, compile(text, is_string, path + ".pattern", r)});
  } else if (type == "ByteLevel") {
    if (r.bool_at(p, path, "add_prefix_space", false)) r.fail(path + ".add_prefix_space", "true is not supported");
    const bool use_regex = r.bool_at(p, path, "use_regex", true);
    pre_steps.push_back({PreStep::Kind::ByteLevel, use_regex ? compile(kGpt2Split, false, path, r) : nullptr});
  } else {
    r.fail(path, str_cat("type '", type, "' is not supported (only Sequence, Split, ByteLevel)"));
  }
}

void HfBpeTokenizer::Impl::load_added_tokens(const json& added, const Reader& r) {
  if (!added.is_array()) r.fail("added_tokens", "must be a list");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string path = str_cat("added_tokens[", i, "]");
    if (!t.is_object()) r.fail(path, "must be an object");
    const json& id = r.at(t, path, "id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      r.fail(path + ".id", str_cat("must be a non-negative integer, got ", id.dump()));
    const auto i32 = static_cast<int32_t>(id.get<int64_t>());
    std::string content = r.string_at(t, path, "content");
    if (content.empty()) r.fail(path + ".content", "is empty");
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (r.bool_at(t, path, flag, false)) r.fail(str_cat(path, ".", flag), str_cat("true is not supported (token \"", content, "\")"));
    const bool normalized = r.bool_at(t, path, "normalized", false);
    auto [other, fresh] = added_ids.emplace(content, i32);
    if (!fresh && other->second != i32)
      r.fail(path, str_cat("token \"", content, "\" is listed with ids ", other->second, " and ", i32));
    tokens_by_id[i32] = content;
    max_id = std::max(max_id, i32);
    // A normalised token is looked for in normalised text, so it is normalised too.
    const std::string match = normalized && use_nfc ? nfc(content) : content;
    AddedIndex& index = normalized ? normalized_added : raw_added;
    any_normalized_added = any_normalized_added || normalized;
    index[static_cast<uint8_t>(match[0])].push_back({match, i32});
  }
  for (AddedIndex* index : {&raw_added, &normalized_added})
    for (auto& bucket : *index)
      std::stable_sort(bucket.begin(), bucket.end(),
                       [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
}

void HfBpeTokenizer::Impl::split_added(const std::string& text, const AddedIndex& index,
                                       std::vector<std::pair<std::string, int32_t>>& out) const {
  size_t gap = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& t : index[static_cast<uint8_t>(text[i])])
      if (text.compare(i, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > gap) out.emplace_back(text.substr(gap, i - gap), -1);
    out.emplace_back(hit->content, hit->id);
    i += hit->content.size();
    gap = i;
  }
  if (gap < text.size()) out.emplace_back(text.substr(gap), -1);
}

std::vector<std::string> HfBpeTokenizer::Impl::pre_tokenize(const std::string& text) const {
  std::vector<std::string> pieces{text}, next;
  for (const PreStep& step : pre_steps) {
    next.clear();
    for (const std::string& p : pieces) {
      if (step.kind == PreStep::Kind::Split) {
        split_isolated(*step.regex, p, next);
        continue;
      }
      const size_t first = next.size();
      if (step.regex) {
        split_isolated(*step.regex, p, next);
      } else {
        next.push_back(p);
      }
      for (size_t k = first; k < next.size(); ++k) next[k] = to_byte_symbols(next[k]);
    }
    pieces.swap(next);
  }
  return pieces;
}

int32_t HfBpeTokenizer::Impl::symbol_id(const std::string& symbol) const {
  auto it = vocab.find(symbol);
  // After ByteLevel every character is a byte symbol, and all 256 were checked at load.
  FLUX_CHECK(it != vocab.end(), label, ": symbol \"", symbol, "\" missing from the vocabulary");
  return it->second;
}

void HfBpeTokenizer::Impl::bpe(const std::string& piece, std::vector<int64_t>& ids) const {
  if (ignore_merges) {
    auto whole = vocab.find(piece);
    if (whole != vocab.end()) {
      ids.push_back(whole->second);
      return;
    }
  }
  // One symbol per character, linked both ways; merged-away symbols get len 0.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    int32_t len;
  };
  std::vector<Symbol> syms;
  const auto* s = reinterpret_cast<const uint8_t*>(piece.data());
  const auto n = static_cast<int32_t>(piece.size());
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(s, i, n, c);
    const auto k = static_cast<int32_t>(syms.size());
    syms.push_back({symbol_id(piece.substr(static_cast<size_t>(start), static_cast<size_t>(i - start))), k - 1, k + 1, 1});
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  // HF's merge order: the lowest rank first, ties broken by the leftmost position; a queued
  // pair whose symbols changed since it was queued is stale and skipped.
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    auto it = merges.find(pair_key(syms[pos].id, syms[syms[pos].next].id));
    if (it != merges.end()) queue.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = syms[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    auto it = merges.find(pair_key(left.id, syms[left.next].id));
    if (it == merges.end() || it->second.id != top.new_id) continue;
    Symbol& right = syms[left.next];
    left.id = top.new_id;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) syms[left.next].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& sym : syms)
    if (sym.len > 0) ids.push_back(sym.id);
}

std::vector<int64_t> HfBpeTokenizer::encode(const std::string& text) const {
  check_utf8(text, "prompt");
  const Impl& m = *impl_;
  std::vector<std::pair<std::string, int32_t>> raw, normalized;
  m.split_added(text, m.raw_added, raw);
  std::vector<int64_t> ids;
  for (const auto& [piece, id] : raw) {
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    normalized.clear();
    const std::string norm = m.use_nfc ? nfc(piece) : piece;
    if (m.any_normalized_added) {
      m.split_added(norm, m.normalized_added, normalized);
    } else {
      normalized.emplace_back(norm, -1);
    }
    for (const auto& [sub, sub_id] : normalized) {
      if (sub_id >= 0) {
        ids.push_back(sub_id);
        continue;
      }
      for (const std::string& word : m.pre_tokenize(sub)) m.bpe(word, ids);
    }
  }
  return ids;
}

std::vector<std::string> HfBpeTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (int64_t id : encode(text)) out.push_back(impl_->tokens_by_id.at(static_cast<int32_t>(id)));
  return out;
}

std::optional<int64_t> HfBpeTokenizer::token_to_id(const std::string& token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> HfBpeTokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id > INT32_MAX) return std::nullopt;
  auto it = impl_->tokens_by_id.find(static_cast<int32_t>(id));
  if (it == impl_->tokens_by_id.end()) return std::nullopt;
  return it->second;
}

int64_t HfBpeTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->max_id) + 1; }

const std::string& HfBpeTokenizer::file_label() const { return impl_->label; }

}  // namespace fluxmpi::text
