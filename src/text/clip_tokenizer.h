#pragma once
/// The CLIP BPE tokenizer of FLUX's first text encoder (tokenizer/ of a diffusers pipeline).
// Semantics of HF CLIPTokenizerFast (= OpenAI CLIP simple_tokenizer without ftfy/html fixes).

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/clip_text.h"
#include "text/encoding.h"

namespace fluxmpi::text {

struct TokenizerDir;

class ClipTokenizer {
 public:
  /// Loads `dir`/vocab.json and merges.txt, the special tokens (bos/eos/pad/unk_token) from
  /// special_tokens_map.json, else tokenizer_config.json, and model_max_length from
  /// tokenizer_config.json. `label` names the folder in error messages (ModelDir::label
  /// ("tokenizer")); empty: the path. Throws TokenizerError naming the file for bad input.
  explicit ClipTokenizer(const std::string& dir, const std::string& label = "");
  ClipTokenizer(ClipTokenizer&&) noexcept;
  ~ClipTokenizer();

  /// [BOS] + tokens[:max_length - 2] + [EOS], padded with PAD to max_length().
  Encoding encode(const std::string& text) const { return encode(text, max_length_); }
  /// The same with another length (>= 2, TokenizerError otherwise).
  Encoding encode(const std::string& text, int64_t max_length) const;
  /// All BPE pieces of `text` as vocabulary strings ("photo</w>"), untruncated, no specials.
  std::vector<std::string> tokenize(const std::string& text) const;

  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  /// model_max_length of tokenizer_config.json (77 for CLIP).
  int64_t max_length() const { return max_length_; }
  /// Number of vocabulary entries.
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  /// The folder's label used in messages.
  const std::string& label() const { return label_; }

 private:
  /// A BPE piece of one word: its vocabulary id and how many bytes of the word it covers.
  struct BpePiece {
    int32_t id;
    int32_t bytes;
  };
  /// A token of the prompt and where it sits: word index and byte offset within that word.
  struct Token {
    int64_t id;
    size_t word;
    size_t offset;
  };
  struct Merge {
    int32_t rank;
    int32_t id;
  };

  void load_vocab(const TokenizerDir& dir);
  void load_merges(const TokenizerDir& dir);
  void load_special_tokens(const TokenizerDir& dir);
  std::vector<Token> tokens_of(const std::vector<ClipWord>& words) const;
  std::vector<BpePiece> bpe(const std::string& word) const;
  std::vector<BpePiece> merge_word(const std::string& word) const;

  std::string label_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<int32_t, std::string> tokens_by_id_;
  std::unordered_map<uint64_t, Merge> merges_;  ///< (left id << 32 | right id) -> rank, merged id
  int32_t byte_ids_[256];
  int32_t byte_end_ids_[256];
  std::string bos_, eos_;
  int64_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  int64_t max_length_ = 0;
  std::unique_ptr<ClipPreSplitter> splitter_;

  /// BPE results per word: prompts repeat words, and BPE is quadratic in the word length.
  struct Cache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<BpePiece>> words;
  };
  std::unique_ptr<Cache> cache_;
};

}  // namespace fluxmpi::text
