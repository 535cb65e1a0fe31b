#include "text/clip_tokenizer.h"

#include <climits>
#include <optional>

#include "core/error.h"
#include "text/tokenizer_files.h"

namespace fluxmpi::text {
namespace {

// Bounds the per-word cache of a long-running job (many prompts); prompts rarely have more
// than a few hundred distinct words.
constexpr size_t kMaxCachedWords = 1 << 16;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

ClipTokenizer::ClipTokenizer(const std::string& dir, const std::string& label)
    : label_(label.empty() ? dir : label), cache_(std::make_unique<Cache>()) {
  const TokenizerDir d{dir, label_};
  load_vocab(d);
  load_merges(d);
  load_special_tokens(d);
  splitter_ = std::make_unique<ClipPreSplitter>(std::vector<std::string>{bos_, eos_});
}

ClipTokenizer::ClipTokenizer(ClipTokenizer&&) noexcept = default;
ClipTokenizer::~ClipTokenizer() = default;

void ClipTokenizer::load_vocab(const TokenizerDir& dir) {
  const std::string label = dir.file_label("vocab.json");
  const std::string text = read_tokenizer_file(dir, "vocab.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw TokenizerError(str_cat(label, ": not valid JSON (truncated or corrupt?): ", e.what()));
  }
  if (!j.is_object()) throw TokenizerError(str_cat(label, ": must be a JSON object mapping tokens to ids"));
  if (j.empty()) throw TokenizerError(str_cat(label, ": is empty"));
  vocab_.reserve(j.size());
  tokens_by_id_.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto& v = it.value();
    const bool ok = v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
    if (!ok)
      throw TokenizerError(str_cat(label, ": token \"", it.key(), "\" must map to a non-negative integer id, got ",
                                   v.dump()));
    const auto id = static_cast<int32_t>(v.get<int64_t>());
    auto [other, fresh] = tokens_by_id_.emplace(id, it.key());
    if (!fresh)
      throw TokenizerError(str_cat(label, ": id ", id, " is used by both \"", other->second, "\" and \"", it.key(), "\""));
    vocab_.emplace(it.key(), id);
  }
  // Byte-level BPE starts from one symbol per byte: all 512 (plain and word-final) must exist.
  for (int b = 0; b < 256; ++b) {
    const std::string& sym = byte_symbols()[b];
    auto plain = vocab_.find(sym);
    auto last = vocab_.find(sym + kEndOfWord);
    if (plain == vocab_.end() || last == vocab_.end())
      throw TokenizerError(str_cat(label, ": the byte symbol \"", plain == vocab_.end() ? sym : sym + kEndOfWord,
                                   "\" (byte ", b, ") is missing; a CLIP vocabulary lists all 256 byte symbols "
                                   "and their </w> forms"));
    byte_ids_[b] = plain->second;
    byte_end_ids_[b] = last->second;
  }
}

void ClipTokenizer::load_merges(const TokenizerDir& dir) {
  const std::string label = dir.file_label("merges.txt");
  const std::string text = read_tokenizer_file(dir, "merges.txt");
  size_t pos = 0;
  int64_t line_no = 0;
  int32_t rank = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    if (line.empty() || space == 0 || space == std::string::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw TokenizerError(str_cat(label, ": line ", line_no, ": expected two symbols separated by one space, got \"",
                                   line, "\""));
    const std::string left = line.substr(0, space);
    const std::string right = line.substr(space + 1);
    for (const std::string& sym : {left, right, left + right}) {
      if (vocab_.find(sym) == vocab_.end())
        throw TokenizerError(str_cat(label, ": line ", line_no, ": symbol \"", sym,
                                     "\" is not in vocab.json (merges.txt and vocab.json do not belong together)"));
    }
    // A pair listed twice keeps its later rank, as the reference implementations' dicts do.
    merges_[pair_key(vocab_.at(left), vocab_.at(right))] = Merge{rank++, vocab_.at(left + right)};
  }
}

void ClipTokenizer::load_special_tokens(const TokenizerDir& dir) {
  std::optional<JsonFile> map, config;
  if (dir.has("special_tokens_map.json")) map = read_json_object(dir, "special_tokens_map.json");
  if (dir.has("tokenizer_config.json")) config = read_json_object(dir, "tokenizer_config.json");
  if (!config)
    throw TokenizerError(str_cat(dir.file_label("tokenizer_config.json"),
                                 ": file not found (it gives model_max_length and the special tokens)"));

  // special_tokens_map.json wins over tokenizer_config.json, as in transformers.
  auto token_id = [&](const std::string& key, std::string* content) -> int64_t {
    for (const JsonFile* f : {map ? &*map : nullptr, &*config}) {
      if (f == nullptr) continue;
      std::optional<std::string> token = special_token(*f, key);
      if (!token) continue;
      auto it = vocab_.find(*token);
      if (it == vocab_.end())
        throw TokenizerError(str_cat(f->label, ": '", key, "' \"", *token, "\" is not in vocab.json"));
      if (content != nullptr) *content = *token;
      return it->second;
    }
    throw TokenizerError(str_cat(dir.label, ": no '", key, "' in ", map ? "special_tokens_map.json or " : "",
                                 "tokenizer_config.json"));
  };
  bos_id_ = token_id("bos_token", &bos_);
  eos_id_ = token_id("eos_token", &eos_);
  pad_id_ = token_id("pad_token", nullptr);
  unk_id_ = token_id("unk_token", nullptr);

  auto it = config->json.find("model_max_length");
  if (it == config->json.end() || !it->is_number_integer())
    throw TokenizerError(str_cat(config->label, ": 'model_max_length' must be an integer (77 for CLIP), got ",
                                 it == config->json.end() ? std::string("nothing") : it->dump()));
  max_length_ = it->get<int64_t>();
  check_max_length(max_length_, str_cat(config->label, ": 'model_max_length'"));
}

std::vector<ClipTokenizer::BpePiece> ClipTokenizer::merge_word(const std::string& word) const {
  std::vector<BpePiece> syms;
  syms.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const auto b = static_cast<uint8_t>(word[i]);
    syms.push_back({i + 1 == word.size() ? byte_end_ids_[b] : byte_ids_[b], 1});
  }
  std::vector<BpePiece> next;
  while (syms.size() > 1) {
    // The adjacent pair that was learnt first is merged, everywhere in the word, left to right.
    const Merge* best = nullptr;
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const uint64_t key = pair_key(syms[i].id, syms[i + 1].id);
      auto it = merges_.find(key);
      if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
        best = &it->second;
        best_key = key;
      }
    }
    if (best == nullptr) break;
    next.clear();
    for (size_t i = 0; i < syms.size(); ++i) {
      if (i + 1 < syms.size() && pair_key(syms[i].id, syms[i + 1].id) == best_key) {
        next.push_back({best->id, syms[i].bytes + syms[i + 1].bytes});
        ++i;
      } else {
        next.push_back(syms[i]);
      }
    }
    syms.swap(next);
  }
  return syms;
}

std::vector<ClipTokenizer::BpePiece> ClipTokenizer::bpe(const std::string& word) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->words.find(word);
    if (it != cache_->words.end()) return it->second;
  }
  std::vector<BpePiece> pieces = merge_word(word);
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (cache_->words.size() >= kMaxCachedWords) cache_->words.clear();
  cache_->words.emplace(word, pieces);
  return pieces;
}

std::vector<ClipTokenizer::Token> ClipTokenizer::tokens_of(const std::vector<ClipWord>& words) const {
  std::vector<Token> tokens;
  for (size_t w = 0; w < words.size(); ++w) {
    const std::string& word = words[w].text;
    // The special tokens written out in a prompt are themselves, as in CLIP's reference code.
    if (word == bos_ || word == eos_) {
      tokens.push_back({word == bos_ ? bos_id_ : eos_id_, w, 0});
      continue;
    }
    size_t offset = 0;
    for (const BpePiece& p : bpe(word)) {
      tokens.push_back({p.id, w, offset});
      offset += static_cast<size_t>(p.bytes);
    }
  }
  return tokens;
}

Encoding ClipTokenizer::encode(const std::string& text, int64_t max_length) const {
  check_max_length(max_length, str_cat(label_, ": CLIP encode"));
  const std::vector<ClipWord> words = splitter_->split(text);
  const std::vector<Token> tokens = tokens_of(words);
  std::vector<int64_t> ids;
  ids.reserve(tokens.size());
  for (const Token& t : tokens) ids.push_back(t.id);
  Encoding e = lay_out(ids, bos_id_, eos_id_, pad_id_, max_length);
  if (e.truncated) {
    const Token& first = tokens[static_cast<size_t>(max_length - 2)];
    const size_t begin = words[first.word].source[first.offset].begin;
    const size_t end = words.back().source.back().end;
    e.dropped = trim_white_space(text.substr(begin, end - begin));
  }
  return e;
}

std::vector<std::string> ClipTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (const Token& t : tokens_of(splitter_->split(text))) out.push_back(tokens_by_id_.at(static_cast<int32_t>(t.id)));
  return out;
}

}  // namespace fluxmpi::text
