// HfBpeTokenizer and Flux2Tokenizer on small hand-made tokenizer.json files: both merge
// spellings, ignore_merges, HF's merge order, added tokens split leftmost-longest, NFC, the Qwen2
// split regex, and one clear error per kind of bad file. (The real layouts are checked exactly
// against the fixtures in tests/parity/text_flux2_tokenizer_parity_test.cpp.)

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "text/clip_text.h"
#include "text/flux2_prompts.h"
#include "text/hf_bpe_tokenizer.h"

namespace fluxmpi::text {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// The Qwen2 split regex exactly as Qwen2/Qwen3 tokenizer.json files hold it.
const char* kQwen2Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// A valid byte-level BPE tokenizer.json: the 256 byte symbols (ids 0..255 in byte order), then
// `extra` vocabulary entries, `merges` as pairs, a Qwen2 split and ByteLevel.
json tiny_tokenizer(const std::vector<std::string>& extra, const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbols()[b]] = b;
  for (const std::string& e : extra) vocab[e] = static_cast<int>(vocab.size());
  json m = json::array();
  for (const auto& [a, b] : merges) m.push_back(json::array({a, b}));
  return {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Split}}}, {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", m}}}};
}

json added(int id, const std::string& content, bool special = true) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
          {"normalized", false}, {"special", special}};
}

class HfBpeFiles : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fluxmpi_hfbpe_" + std::to_string(::getpid()) + "_" + testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
  }
  void write(const json& tokenizer) { write("tokenizer.json", tokenizer.dump()); }
  HfBpeTokenizer load() const { return HfBpeTokenizer(dir_.string(), "model dir '/m': tokenizer"); }

  // Loading must throw one TokenizerError line that contains every one of `parts`.
  template <typename Load>
  void expect_error(Load&& load_it, const std::vector<std::string>& parts) {
    try {
      load_it();
      ADD_FAILURE() << "loading succeeded; expected a TokenizerError mentioning " << parts[0];
    } catch (const TokenizerError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
      for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what;
    }
  }
  void expect_error(const std::vector<std::string>& parts) {
    expect_error([&] { load(); }, parts);
  }

  fs::path dir_;
};

TEST_F(HfBpeFiles, BothMergeSpellingsGiveTheSameIds) {
  json t = tiny_tokenizer({"Ġc", "at", "Ġcat"}, {{"Ġ", "c"}, {"a", "t"}, {"Ġc", "at"}});
  write(t);
  const auto pairs = load().encode("a cat");
  json s = t;
  s["model"]["merges"] = json::array({"Ġ c", "a t", "Ġc at"});
  write(s);
  EXPECT_EQ(load().encode("a cat"), pairs);
  EXPECT_EQ(pairs, (std::vector<int64_t>{'a', 258}));
  EXPECT_EQ(load().tokenize("a cat"), (std::vector<std::string>{"a", "Ġcat"}));
}

TEST_F(HfBpeFiles, MergesFollowRankThenLeftmostPosition) {
  // "aaa": the pair (a, a) at 0 merges first, leaving "aa" + "a" (HF's queue order).
  write(tiny_tokenizer({"aa", "aaa"}, {{"a", "a"}, {"aa", "a"}}));
  EXPECT_EQ(load().tokenize("aaa"), (std::vector<std::string>{"aaa"}));
  EXPECT_EQ(load().tokenize("aaaa"), (std::vector<std::string>{"aa", "aa"}));
  EXPECT_EQ(load().tokenize("aaaaa"), (std::vector<std::string>{"aa", "aaa"}));
}

TEST_F(HfBpeFiles, IgnoreMergesTakesWholeVocabularyWords) {
  // "cat" is in the vocabulary but no merge builds it.
  json t = tiny_tokenizer({"cat"}, {});
  write(t);
  EXPECT_EQ(load().tokenize("cat"), (std::vector<std::string>{"c", "a", "t"}));
  t["model"]["ignore_merges"] = true;
  write(t);
  EXPECT_EQ(load().tokenize("cat"), (std::vector<std::string>{"cat"}));
}

TEST_F(HfBpeFiles, Qwen2SplitRegexCompilesAndSplitsAsHf) {
  // With ignore_merges each piece of the split that is a vocabulary word comes back whole, so
  // the tokens show the pieces.
  json t = tiny_tokenizer({"'m", "Ġok", "ĊĊ", "yes", "Ġ12"}, {});
  t["model"]["ignore_merges"] = true;
  write(t);
  EXPECT_EQ(load().tokenize("I'm  ok\n\nyes 12"),
            (std::vector<std::string>{"I", "'m", "Ġ", "Ġok", "ĊĊ", "yes", "Ġ", "1", "2"}));
}

TEST_F(HfBpeFiles, ByteLevelAloneSplitsWithGpt2Regex) {
  // A ByteLevel pre-tokenizer with use_regex applies GPT-2's split itself.
  json t = tiny_tokenizer({"'m", "Ġok", "Ġ12"}, {});
  t["model"]["ignore_merges"] = true;
  t["pre_tokenizer"] = t["pre_tokenizer"]["pretokenizers"][1];
  t["pre_tokenizer"]["use_regex"] = true;
  write(t);
  EXPECT_EQ(load().tokenize("I'm  ok 12"), (std::vector<std::string>{"I", "'m", "Ġ", "Ġok", "Ġ12"}));
}

TEST_F(HfBpeFiles, NormalizedAddedTokensMatchTheNormalisedText) {
  json t = tiny_tokenizer({}, {});
  t["normalizer"] = {{"type", "NFC"}};
  t["added_tokens"] = json::array({added(300, "\xC3\xA9t\xC3\xA9")});  // "été", composed
  t["added_tokens"][0]["normalized"] = true;
  write(t);
  // Written decomposed, it is found only after NFC.
  EXPECT_EQ(load().encode("xe\xCC\x81te\xCC\x81"), (std::vector<int64_t>{'x', 300}));
}

TEST_F(HfBpeFiles, AddedTokensSplitFirstLeftmostLongest) {
  json t = tiny_tokenizer({}, {});
  t["added_tokens"] = json::array({added(300, "<a>"), added(301, "<a><b>"), added(302, "b>", false)});
  write(t);
  const HfBpeTokenizer tok = load();
  // "<a><b>" wins over "<a>" at the same start; "b>" (non-special) is split out inside words too.
  EXPECT_EQ(tok.encode("x<a><b>y<a>b>"), (std::vector<int64_t>{'x', 301, 'y', 300, 302}));
  EXPECT_EQ(tok.token_to_id("<a><b>"), 301);
  EXPECT_EQ(tok.id_to_token(302), "b>");
  EXPECT_EQ(tok.vocab_size(), 303);
}

TEST_F(HfBpeFiles, NfcNormalizerComposes) {
  json t = tiny_tokenizer({}, {});
  t["normalizer"] = {{"type", "NFC"}};
  write(t);
  EXPECT_EQ(load().encode("e\xCC\x81"), load().encode("\xC3\xA9"));  // e + combining acute == é
  t["normalizer"] = nullptr;
  write(t);
  EXPECT_NE(load().encode("e\xCC\x81"), load().encode("\xC3\xA9"));
}

TEST_F(HfBpeFiles, InvalidUtf8IsAUsageError) {
  write(tiny_tokenizer({}, {}));
  EXPECT_THROW(load().encode("bad \xFF byte"), UsageError);
}

TEST_F(HfBpeFiles, MissingFile) { expect_error({"model dir '/m': tokenizer/tokenizer.json", "file not found"}); }

TEST_F(HfBpeFiles, MalformedJson) {
  const std::string text = tiny_tokenizer({}, {}).dump();
  write("tokenizer.json", text.substr(0, text.size() / 2));
  expect_error({"tokenizer/tokenizer.json", "not valid JSON"});
}

TEST_F(HfBpeFiles, NotBpe) {
  json t = tiny_tokenizer({}, {});
  t["model"]["type"] = "Unigram";
  write(t);
  expect_error({"tokenizer/tokenizer.json: model type 'Unigram' is not BPE"});
}

TEST_F(HfBpeFiles, UnsupportedPartsAreNamed) {
  json t = tiny_tokenizer({}, {});
  t["normalizer"] = {{"type", "Lowercase"}};
  write(t);
  expect_error({"tokenizer.json: normalizer", "'Lowercase'"});

  t = tiny_tokenizer({}, {});
  t["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  write(t);
  expect_error({"pre_tokenizer.pretokenizers[0].behavior", "'Removed'"});

  t = tiny_tokenizer({}, {});
  t["pre_tokenizer"] = {{"type", "Whitespace"}};
  write(t);
  expect_error({"tokenizer.json: pre_tokenizer", "'Whitespace'"});

  t = tiny_tokenizer({}, {});
  t["pre_tokenizer"] = t["pre_tokenizer"]["pretokenizers"][0];
  write(t);
  expect_error({"pre_tokenizer", "0 ByteLevel"});

  t = tiny_tokenizer({}, {});
  t["model"]["byte_fallback"] = true;
  write(t);
  expect_error({"model.byte_fallback"});

  t = tiny_tokenizer({}, {});
  t["added_tokens"] = json::array({added(300, "<a>")});
  t["added_tokens"][0]["lstrip"] = true;
  write(t);
  expect_error({"added_tokens[0].lstrip", "<a>"});
}

TEST_F(HfBpeFiles, BadVocabularyAndMerges) {
  json t = tiny_tokenizer({}, {});
  t["model"]["vocab"].erase(byte_symbols()['a']);
  write(t);
  expect_error({"model.vocab", "byte symbol \"a\""});

  t = tiny_tokenizer({}, {{"a", "b"}});
  write(t);
  expect_error({"model.merges[0]", "\"ab\" is not in model.vocab"});

  t = tiny_tokenizer({"ab"}, {});
  t["model"]["merges"] = json::array({"ab"});
  write(t);
  expect_error({"model.merges[0]", "two symbols"});

  t = tiny_tokenizer({}, {});
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  write(t);
  expect_error({"pre_tokenizer.pretokenizers[0].pattern", "does not compile"});

  t = tiny_tokenizer({}, {});
  t["model"].erase("merges");
  write(t);
  expect_error({"tokenizer.json: model.merges: missing"});
}

// ---- Flux2Tokenizer: the style and special tokens from the folder's config files ----

json qwen_config() { return {{"tokenizer_class", "Qwen2Tokenizer"}, {"pad_token", "<|endoftext|>"}}; }

TEST_F(HfBpeFiles, Flux2StyleAndPadFromConfig) {
  json t = tiny_tokenizer({}, {});
  t["added_tokens"] = json::array({added(256, "<|endoftext|>"), added(257, "<pad>"), added(258, "<s>")});
  write(t);
  write("tokenizer_config.json", qwen_config().dump());
  {
    const Flux2Tokenizer tok(dir_.string());
    EXPECT_EQ(tok.style(), Flux2TextStyle::Qwen3);
    EXPECT_EQ(tok.pad_id(), 256);
    const PromptTokens p = tokenize_flux2_prompt(tok, "hi", 200);
    EXPECT_EQ(p.ids.size(), 200u);
    EXPECT_FALSE(p.truncated());
    EXPECT_EQ(p.ids.back(), 256);  // right padding
  }
  write("tokenizer_config.json",
        json({{"tokenizer_class", "LlamaTokenizerFast"}, {"processor_class", "PixtralProcessor"}, {"pad_token", "<pad>"},
              {"bos_token", "<s>"}})
            .dump());
  {
    const Flux2Tokenizer tok(dir_.string());
    EXPECT_EQ(tok.style(), Flux2TextStyle::Mistral);
    const PromptTokens p = tokenize_flux2_prompt(tok, "hi", 400);
    EXPECT_EQ(p.ids.front(), 257);  // left padding
    EXPECT_EQ(p.ids[static_cast<size_t>(400 - p.real_tokens)], 258);
    // A 10-token cut keeps the start (<s> first) and drops the end.
    const PromptTokens cut = tokenize_flux2_prompt(tok, "hi", 10);
    EXPECT_TRUE(cut.truncated());
    EXPECT_EQ(cut.ids.front(), 258);
    EXPECT_EQ(cut.mask, std::vector<int64_t>(10, 1));
  }
  // special_tokens_map.json wins over tokenizer_config.json.
  write("tokenizer_config.json", qwen_config().dump());
  write("special_tokens_map.json", json({{"pad_token", {{"content", "<pad>"}}}}).dump());
  EXPECT_EQ(Flux2Tokenizer(dir_.string()).pad_id(), 257);
}

TEST_F(HfBpeFiles, Flux2BadConfigs) {
  json t = tiny_tokenizer({}, {});
  t["added_tokens"] = json::array({added(256, "<|endoftext|>")});
  write(t);
  auto load_flux2 = [&] { Flux2Tokenizer tok(dir_.string(), "model dir '/m': tokenizer"); };

  expect_error(load_flux2, {"tokenizer/tokenizer_config.json", "file not found"});

  write("tokenizer_config.json", json({{"tokenizer_class", "T5Tokenizer"}, {"pad_token", "<|endoftext|>"}}).dump());
  expect_error(load_flux2, {"tokenizer/tokenizer_config.json", "'T5Tokenizer' is not a FLUX.2 tokenizer"});

  write("tokenizer_config.json", json({{"tokenizer_class", "LlamaTokenizerFast"}, {"pad_token", "<|endoftext|>"}}).dump());
  expect_error(load_flux2, {"PixtralProcessor"});

  write("tokenizer_config.json", json({{"tokenizer_class", "Qwen2Tokenizer"}}).dump());
  expect_error(load_flux2, {"no 'pad_token'"});

  write("tokenizer_config.json", json({{"tokenizer_class", "Qwen2Tokenizer"}, {"pad_token", "<nope>"}}).dump());
  expect_error(load_flux2, {"tokenizer_config.json: 'pad_token' \"<nope>\" is not a token of"});

  json c = qwen_config();
  c["split_special_tokens"] = true;
  write("tokenizer_config.json", c.dump());
  expect_error(load_flux2, {"tokenizer_config.json: 'split_special_tokens' true is not supported"});

  c = qwen_config();
  c["padding_side"] = "middle";
  write("tokenizer_config.json", c.dump());
  expect_error(load_flux2, {"'padding_side' must be \"left\" or \"right\""});
}

TEST_F(HfBpeFiles, Flux2MaxLengthMustBePositive) {
  json t = tiny_tokenizer({}, {});
  t["added_tokens"] = json::array({added(256, "<|endoftext|>")});
  write(t);
  write("tokenizer_config.json", qwen_config().dump());
  const Flux2Tokenizer tok(dir_.string());
  EXPECT_THROW(tokenize_flux2_prompt(tok, "x", 0), UsageError);
}

}  // namespace
}  // namespace fluxmpi::text
