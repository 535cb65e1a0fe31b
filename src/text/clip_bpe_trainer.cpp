#include "text/clip_bpe_trainer.h"

#include <filesystem>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/clip_text.h"
#include "text/tokenizer_files.h"

namespace fluxmpi::text {
namespace {

constexpr const char* kStartOfText = "<|startoftext|>";
constexpr const char* kEndOfText = "<|endoftext|>";
constexpr int64_t kBaseVocab = 2 * 256 + 2;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// The corpus as distinct words with their counts, each a sequence of interned symbols; the
// state of the merge loop with pair counts kept up to date incrementally.
class BpeState {
 public:
  explicit BpeState(const std::string& corpus) {
    ClipPreSplitter splitter({kStartOfText, kEndOfText});
    std::map<std::string, int64_t> counts;  // ordered: the word list does not depend on hashing
    for (const ClipWord& w : splitter.split(corpus))
      if (w.text != kStartOfText && w.text != kEndOfText) ++counts[w.text];
    for (const auto& [text, count] : counts) {
      Word word{{}, count};
      for (size_t i = 0; i < text.size(); ++i) {
        std::string sym = byte_symbols()[static_cast<uint8_t>(text[i])];
        if (i + 1 == text.size()) sym += kEndOfWord;
        word.symbols.push_back(intern(sym));
      }
      words_.push_back(std::move(word));
    }
    for (int32_t w = 0; w < static_cast<int32_t>(words_.size()); ++w) count_pairs(w, +1);
  }

  // The most frequent pair (ties: smallest left, then right string); false when none occurs twice.
  bool best_pair(int32_t* left, int32_t* right) const {
    const std::pair<const uint64_t, int64_t>* best = nullptr;
    for (const auto& entry : pair_counts_) {
      if (entry.second < 2) continue;
      if (best == nullptr || entry.second > best->second ||
          (entry.second == best->second && less(entry.first, best->first)))
        best = &entry;
    }
    if (best == nullptr) return false;
    *left = static_cast<int32_t>(best->first >> 32);
    *right = static_cast<int32_t>(best->first & 0xffffffffu);
    return true;
  }

  // Merges every occurrence of (left, right); returns whether the joined symbol is new.
  bool merge(int32_t left, int32_t right) {
    const size_t before = symbols_.size();
    const int32_t joined = intern(symbols_[left] + symbols_[right]);
    const uint64_t key = pair_key(left, right);
    std::vector<int32_t> candidates = pair_words_[key];
    std::unordered_set<int32_t> seen;
    for (int32_t w : candidates) {
      if (!seen.insert(w).second) continue;
      count_pairs(w, -1);
      std::vector<int32_t>& syms = words_[w].symbols;
      std::vector<int32_t> out;
      out.reserve(syms.size());
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == left && syms[i + 1] == right) {
          out.push_back(joined);
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      syms.swap(out);
      count_pairs(w, +1);
    }
    pair_words_.erase(key);
    return symbols_.size() > before;
  }

  const std::string& symbol(int32_t id) const { return symbols_[id]; }

 private:
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };

  int32_t intern(const std::string& sym) {
    auto [it, fresh] = ids_.emplace(sym, static_cast<int32_t>(symbols_.size()));
    if (fresh) symbols_.push_back(sym);
    return it->second;
  }

  bool less(uint64_t a, uint64_t b) const {
    const std::string& al = symbols_[a >> 32];
    const std::string& bl = symbols_[b >> 32];
    if (al != bl) return al < bl;
    return symbols_[a & 0xffffffffu] < symbols_[b & 0xffffffffu];
  }

  void count_pairs(int32_t w, int sign) {
    const Word& word = words_[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t key = pair_key(word.symbols[i], word.symbols[i + 1]);
      auto it = pair_counts_.emplace(key, 0).first;
      it->second += sign * word.count;
      if (it->second == 0) pair_counts_.erase(it);
      if (sign > 0) pair_words_[key].push_back(w);
    }
  }

  std::vector<Word> words_;
  std::vector<std::string> symbols_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words_;  // words that may hold the pair
};

nlohmann::ordered_json added_token(const std::string& content, bool normalized) {
  return {{"content", content}, {"lstrip", false}, {"normalized", normalized}, {"rstrip", false}, {"single_word", false}};
}

}  // namespace

BpeMerges train_clip_bpe(const std::string& corpus_text, int64_t vocab_size) {
  if (vocab_size < kBaseVocab)
    throw UsageError(str_cat("CLIP BPE vocab_size must be at least ", kBaseVocab,
                             " (256 byte symbols, their </w> forms and 2 special tokens), got ", vocab_size));
  BpeState state(corpus_text);
  BpeMerges merges;
  int64_t size = kBaseVocab;
  int32_t left = 0, right = 0;
  while (size < vocab_size && state.best_pair(&left, &right)) {
    merges.emplace_back(state.symbol(left), state.symbol(right));
    if (state.merge(left, right)) ++size;
  }
  return merges;
}

std::vector<std::string> clip_vocab_from_merges(const BpeMerges& merges) {
  std::vector<std::string> vocab;
  std::unordered_set<std::string> present;
  auto add = [&](const std::string& token) {
    if (present.insert(token).second) vocab.push_back(token);
  };
  for (uint8_t b : byte_symbol_order()) add(byte_symbols()[b]);
  for (uint8_t b : byte_symbol_order()) add(byte_symbols()[b] + kEndOfWord);
  for (const auto& [l, r] : merges) add(l + r);
  add(kStartOfText);
  add(kEndOfText);
  return vocab;
}

void write_clip_tokenizer(const BpeMerges& merges, const std::string& out_dir, int64_t model_max_length) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw IoError(str_cat("cannot create directory '", out_dir, "': ", ec.message()));
  const std::filesystem::path dir(out_dir);

  const std::vector<std::string> vocab = clip_vocab_from_merges(merges);
  nlohmann::json vocab_json = nlohmann::json::object();  // std::map: keys sorted by bytes = code points
  for (size_t id = 0; id < vocab.size(); ++id) vocab_json[vocab[id]] = id;
  write_text_file((dir / "vocab.json").string(), vocab_json.dump(2) + "\n");

  std::string merges_text = "#version: 0.2\n";
  for (const auto& [l, r] : merges) merges_text += l + " " + r + "\n";
  write_text_file((dir / "merges.txt").string(), merges_text);

  const size_t bos_id = vocab.size() - 2, eos_id = vocab.size() - 1;
  nlohmann::ordered_json bos = added_token(kStartOfText, true), eos = added_token(kEndOfText, false);
  nlohmann::ordered_json bos_decoder = bos, eos_decoder = eos;
  bos_decoder["special"] = true;
  eos_decoder["special"] = true;
  nlohmann::ordered_json config = {
      {"add_prefix_space", false},
      {"added_tokens_decoder", {{std::to_string(bos_id), bos_decoder}, {std::to_string(eos_id), eos_decoder}}},
      {"bos_token", kStartOfText},
      {"clean_up_tokenization_spaces", true},
      {"do_lower_case", true},
      {"eos_token", kEndOfText},
      {"errors", "replace"},
      {"model_max_length", model_max_length},
      {"pad_token", kEndOfText},
      {"tokenizer_class", "CLIPTokenizer"},
      {"unk_token", kEndOfText}};
  write_text_file((dir / "tokenizer_config.json").string(), config.dump(2) + "\n");

  nlohmann::ordered_json special = {{"bos_token", bos}, {"eos_token", eos}, {"pad_token", eos}, {"unk_token", eos}};
  write_text_file((dir / "special_tokens_map.json").string(), special.dump(2) + "\n");
}

}  // namespace fluxmpi::text
