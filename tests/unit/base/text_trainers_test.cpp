// The self-made demo tokenizers: CLIP BPE learnt from tools/make_tiny_model/corpus.txt and a
// sentencepiece unigram model for T5; both load with the tokenizers, encode losslessly and are
// byte-identical when trained twice. The writer reproduces the real CLIP files from their merges.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <unistd.h>

#include "core/error.h"
#include "support/fixtures.h"
#include "text/clip_bpe_trainer.h"
#include "text/clip_text.h"
#include "text/clip_tokenizer.h"
#include "text/t5_tokenizer.h"
#include "text/t5_unigram_trainer.h"

namespace fluxmpi::text {
namespace {
namespace fs = std::filesystem;

const std::string kCorpus = std::string(FLUXMPI_SOURCE_DIR) + "/tools/make_tiny_model/corpus.txt";

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::vector<std::string> corpus_lines() {
  std::vector<std::string> lines;
  std::istringstream in(read_bytes(kCorpus));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

class TempDirs : public testing::Test {
 protected:
  fs::path dir(const std::string& name) {
    fs::path p = fs::temp_directory_path() / ("fluxmpi_trainers_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(p);
    made_.push_back(p);
    return p;
  }
  void TearDown() override {
    for (const auto& p : made_) fs::remove_all(p);
  }
  std::vector<fs::path> made_;
};

// ---- CLIP BPE ----

TEST(ClipBpeTrainer, LearnsTheMostFrequentPairFirstWithByteOrderTies) {
  // Words: "aaa" x2 -> a a a</w>, "ab" -> a b</w>. (a,a) and (a,a</w>) both occur twice; "a" < "a</w>"
  // picks (a,a); then (aa, a</w>) occurs twice; (a, b</w>) only once, which ends training.
  const BpeMerges merges = train_clip_bpe("AAA aaa\nab", 10000);
  EXPECT_EQ(merges, (BpeMerges{{"a", "a"}, {"aa", "a</w>"}}));
}

TEST(ClipBpeTrainer, StopsAtTheVocabularySizeOrWhenNoPairRepeats) {
  EXPECT_EQ(train_clip_bpe("the cat, the hat, the bat", 515).size(), 1u);
  EXPECT_THROW(train_clip_bpe("the cat", 513), UsageError);
  // (c,a) and (a,t</w>) occur twice, "a" < "c" picks (a,t</w>); then (c,at</w>) twice; nothing in
  // "dog" repeats, so a larger vocabulary cannot be filled.
  EXPECT_EQ(train_clip_bpe("cat cat dog", 1000), (BpeMerges{{"a", "t</w>"}, {"c", "at</w>"}}));
}

TEST(ClipBpeTrainer, VocabularyFollowsClipsLayout) {
  const std::vector<std::string> vocab = clip_vocab_from_merges({{"c", "a"}, {"ca", "t</w>"}});
  ASSERT_EQ(vocab.size(), 516u);
  EXPECT_EQ(vocab[0], "!");
  EXPECT_EQ(vocab[256], "!</w>");
  EXPECT_EQ(vocab[187], "\xC3\xBF");  // 'ÿ', the last printable byte
  EXPECT_EQ(vocab[188], "\xC4\x80");  // byte 0 -> U+0100
  EXPECT_EQ(vocab[512], "ca");
  EXPECT_EQ(vocab[513], "cat</w>");
  EXPECT_EQ(vocab[514], "<|startoftext|>");
  EXPECT_EQ(vocab[515], "<|endoftext|>");
}

class ClipBpeOnCorpus : public TempDirs {};

TEST_F(ClipBpeOnCorpus, TrainsLoadsAndEncodesLosslessly) {
  const std::string corpus = read_bytes(kCorpus);
  ASSERT_FALSE(corpus.empty()) << "corpus not found: " << kCorpus;
  const int64_t vocab_size = 1024;
  const BpeMerges merges = train_clip_bpe(corpus, vocab_size);
  const fs::path out = dir("clip");
  write_clip_tokenizer(merges, out.string());

  const ClipTokenizer tok(out.string());
  EXPECT_EQ(tok.vocab_size(), vocab_size);
  EXPECT_EQ(tok.max_length(), 77);
  EXPECT_EQ(tok.bos_id(), vocab_size - 2);
  EXPECT_EQ(tok.eos_id(), vocab_size - 1);
  EXPECT_EQ(tok.pad_id(), vocab_size - 1);
  // Words frequent in the corpus became single tokens.
  EXPECT_EQ(tok.tokenize("A photo of a cat, soft light"),
            (std::vector<std::string>{"a</w>", "photo</w>", "of</w>", "a</w>", "cat</w>", ",</w>", "soft</w>",
                                      "light</w>"}));
  const Encoding e = tok.encode("a cat");
  EXPECT_EQ(e.ids[0], tok.bos_id());
  EXPECT_EQ(e.ids[3], tok.eos_id());
  EXPECT_EQ(e.num_tokens, 2);

  // Every corpus line: the tokens' bytes spell the pre-split words again, one word at a time.
  std::unordered_map<std::string, uint8_t> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[byte_symbols()[b]] = static_cast<uint8_t>(b);
  const ClipPreSplitter splitter({"<|startoftext|>", "<|endoftext|>"});
  int64_t tokens = 0, words_total = 0;
  for (const std::string& line : corpus_lines()) {
    std::string words, spelled;
    for (const ClipWord& w : splitter.split(line)) {
      words += w.text + "|";
      ++words_total;
    }
    for (std::string t : tok.tokenize(line)) {
      const bool last = t.size() >= 4 && t.compare(t.size() - 4, 4, kEndOfWord) == 0;
      if (last) t.resize(t.size() - 4);
      for (size_t i = 0; i < t.size();) {
        size_t len = 1;
        while (i + len < t.size() && (static_cast<uint8_t>(t[i + len]) & 0xC0) == 0x80) ++len;
        ASSERT_TRUE(byte_of.count(t.substr(i, len))) << "not a byte symbol in token of line: " << line;
        spelled.push_back(static_cast<char>(byte_of[t.substr(i, len)]));
        i += len;
      }
      if (last) spelled += "|";
      ++tokens;
    }
    EXPECT_EQ(spelled, words) << "line: " << line;
  }
  // 510 merges learnt on this very text: under 2 tokens per word (bytes alone: ~4.9 per word).
  EXPECT_LT(static_cast<double>(tokens) / static_cast<double>(words_total), 2.0);
}

TEST_F(ClipBpeOnCorpus, IsDeterministic) {
  const std::string corpus = read_bytes(kCorpus);
  ASSERT_FALSE(corpus.empty()) << "corpus not found: " << kCorpus;
  const fs::path a = dir("clip_a"), b = dir("clip_b");
  write_clip_tokenizer(train_clip_bpe(corpus, 1500), a.string());
  write_clip_tokenizer(train_clip_bpe(corpus, 1500), b.string());
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"}) {
    const std::string x = read_bytes(a / f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == read_bytes(b / f)) << f << " differs between two trainings on the same corpus";
  }
}

class ClipWriter : public TempDirs {};

TEST_F(ClipWriter, ReproducesTheRealClipFilesFromTheirMerges) {
  const fs::path real = fs::path(test::assets_root()) / "tokenizers" / "clip";
  if (!fs::is_regular_file(real / "merges.txt")) {
    if (test::running_in_ci()) FAIL() << "CLIP tokenizer assets not found in " << real;
    GTEST_SKIP() << "CLIP tokenizer assets not found in " << real;
  }
  BpeMerges merges;
  std::istringstream in(read_bytes(real / "merges.txt"));
  std::string line;
  std::getline(in, line);  // #version
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  const fs::path out = dir("clip_real");
  write_clip_tokenizer(merges, out.string());
  for (const char* f : {"vocab.json", "merges.txt"})
    EXPECT_TRUE(read_bytes(out / f) == read_bytes(real / f)) << f << " is not byte-identical to CLIP's";
}

// ---- T5 unigram ----

class T5UnigramOnCorpus : public TempDirs {};

TEST_F(T5UnigramOnCorpus, TrainsWithT5SpecialIdsAndEncodesLosslessly) {
  const int64_t vocab_size = 1000;
  const fs::path out = dir("t5");
  train_t5_unigram(kCorpus, vocab_size, out.string());
  const T5Tokenizer tok(out.string());
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.unk_id(), 2);
  EXPECT_EQ(tok.vocab_size(), vocab_size);

  const Encoding e = tok.encode("a photo of a cat", 32);
  ASSERT_EQ(e.ids.size(), 32u);
  EXPECT_EQ(e.ids[e.num_tokens], 1);
  EXPECT_EQ(e.ids.back(), 0);
  EXPECT_LE(e.num_tokens, 6);  // frequent words are whole pieces

  // Every character of the corpus is covered: no line has an unknown piece, and the pieces
  // spell the line again (with '▁' for the dummy prefix and each space).
  for (const std::string& line : corpus_lines()) {
    std::string spelled;
    for (const std::string& p : tok.pieces(line)) spelled += p;
    std::string want = "\xE2\x96\x81";
    for (char c : line) want += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    EXPECT_EQ(spelled, want) << "line: " << line;
    for (int64_t id : tok.encode(line, 512).ids) EXPECT_NE(id, tok.unk_id()) << "line: " << line;
  }
}

TEST_F(T5UnigramOnCorpus, IsDeterministic) {
  const fs::path a = dir("t5_a"), b = dir("t5_b");
  train_t5_unigram(kCorpus, 800, a.string());
  train_t5_unigram(kCorpus, 800, b.string());
  for (const char* f : {"spiece.model", "tokenizer_config.json", "special_tokens_map.json"}) {
    const std::string x = read_bytes(a / f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == read_bytes(b / f)) << f << " differs between two trainings on the same corpus";
  }
}

TEST_F(T5UnigramOnCorpus, VocabularyTooLargeForTheCorpusIsAUsageError) {
  try {
    train_t5_unigram(kCorpus, 1000000, dir("t5_big").string());
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("Vocabulary size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(train_t5_unigram(kCorpus + ".missing", 100, dir("t5_none").string()), UsageError);
}

}  // namespace
}  // namespace fluxmpi::text
