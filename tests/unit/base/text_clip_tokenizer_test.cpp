// ClipTokenizer: exact ids and BPE tokens on every case of tokenizer_cases.json (the real FLUX.1
// tokenizer/ files), the quoting of dropped text, and one clear error per kind of bad file.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "core/error.h"
#include "support/fixtures.h"
#include "text/clip_bpe_trainer.h"
#include "text/clip_tokenizer.h"

namespace fluxmpi::text {
namespace {
namespace fs = std::filesystem;

std::string clip_assets() { return test::assets_root() + "/tokenizers/clip"; }

const ClipTokenizer& real_clip() {
  static const ClipTokenizer tok(clip_assets());
  return tok;
}

class ClipFixtureCase : public testing::TestWithParam<test::TokenizerCase> {};

TEST_P(ClipFixtureCase, IdsTokensAndTruncationMatchReference) {
  FLUXMPI_REQUIRE_FIXTURES();
  ASSERT_FALSE(GetParam().id.empty()) << "no cases in " << test::fixture_root() << "/tokenizer_cases.json";
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  const nlohmann::json& c = GetParam().json;
  const std::string text = c["text"].get<std::string>();
  const std::string where = "tokenizer_cases.json case '" + GetParam().id + "'";

  const Encoding e = real_clip().encode(text);
  const auto want_ids = c["clip_input_ids"].get<std::vector<int64_t>>();
  EXPECT_EQ(e.ids, want_ids) << where << ": clip_input_ids differ at " << test::first_difference(e.ids, want_ids);
  EXPECT_EQ(e.num_tokens, c["clip_num_tokens"].get<int64_t>()) << where << ": clip_num_tokens";
  EXPECT_EQ(e.truncated, c["clip_truncated"].get<bool>()) << where << ": clip_truncated";
  EXPECT_EQ(e.dropped.empty(), !e.truncated) << where << ": dropped text '" << e.dropped << "'";

  EXPECT_EQ(real_clip().tokenize(text), c["clip_tokens"].get<std::vector<std::string>>()) << where << ": clip_tokens";
}

INSTANTIATE_TEST_SUITE_P(TokenizerCases, ClipFixtureCase, testing::ValuesIn(test::tokenizer_cases()), test::tokenizer_case_name);

TEST(ClipTokenizer, ReadsSpecialTokensAndLengthFromConfig) {
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  const ClipTokenizer& tok = real_clip();
  EXPECT_EQ(tok.bos_id(), 49406);
  EXPECT_EQ(tok.eos_id(), 49407);
  EXPECT_EQ(tok.pad_id(), 49407);
  EXPECT_EQ(tok.unk_id(), 49407);
  EXPECT_EQ(tok.max_length(), 77);
  EXPECT_EQ(tok.vocab_size(), 49408);
}

std::string repeat(const std::string& piece, int n, const std::string& sep = " ") {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? sep : "") + piece;
  return s;
}

TEST(ClipTokenizer, DroppedTextQuotesWholeWordsAfterTheCut) {
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  // 5 one-token words per phrase, 20 phrases = 100 tokens; 75 fit, so phrases 16..20 are cut.
  const Encoding e = real_clip().encode(repeat("a photo of a cat", 20) + "  ");
  EXPECT_TRUE(e.truncated);
  EXPECT_EQ(e.num_tokens, 100);
  EXPECT_EQ(e.dropped, repeat("a photo of a cat", 5));
  EXPECT_EQ(e.ids.size(), 77u);
  EXPECT_EQ(e.ids.back(), real_clip().eos_id());  // no room for padding: EOS is last
}

TEST(ClipTokenizer, ExactlyFullIsNotTruncated) {
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  Encoding e = real_clip().encode(repeat("cat", 75));
  EXPECT_FALSE(e.truncated);
  EXPECT_EQ(e.dropped, "");
  e = real_clip().encode(repeat("cat", 76));
  EXPECT_TRUE(e.truncated);
  EXPECT_EQ(e.dropped, "cat");
}

TEST(ClipTokenizer, DroppedTextStartsInsideASplitWord) {
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  // super|cali|frag|ili|stic|expi|ali|do|cious: only "super" fits after 74 words.
  const Encoding e = real_clip().encode(repeat("cat", 74) + " supercalifragilisticexpialidocious!");
  EXPECT_EQ(e.dropped, "califragilisticexpialidocious!");
}

TEST(ClipTokenizer, DroppedTextIsTheOriginalUnnormalisedText) {
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  // Upper case, a decomposed é (e + U+0301), a tab and a run of spaces survive in the quote.
  const std::string tail = "Cafe\xCC\x81  NA\xC3\x8FVE\tStra\xC3\x9F" "e";
  const Encoding e = real_clip().encode(repeat("cat", 75) + " \n " + tail + "\n");
  EXPECT_EQ(e.dropped, tail);
}

TEST(ClipTokenizer, CharacterSplitAcrossTokensIsQuotedWhole) {
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  // "straße" -> stra | Ã | Ł | e</w>: the two bytes of ß are two tokens; cut between them.
  EXPECT_EQ(real_clip().encode(repeat("cat", 73) + " Straße").dropped, "ße");
  // 'İ' lower-cases to "i" + U+0307, which the pre-split makes two words; cut between them.
  EXPECT_EQ(real_clip().encode(repeat("cat", 74) + " İstanbul").dropped, "İstanbul");
}

TEST(ClipTokenizer, ShorterMaxLength) {
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  const Encoding e = real_clip().encode("a photo of a cat", 4);
  EXPECT_EQ(e.ids, (std::vector<int64_t>{49406, 320, 1125, 49407}));
  EXPECT_EQ(e.dropped, "of a cat");
  EXPECT_THROW(real_clip().encode("a cat", 1), TokenizerError);
}

TEST(ClipTokenizer, InvalidUtf8PromptIsAUsageError) {
  FLUXMPI_REQUIRE_ASSET(clip_assets() + "/vocab.json", "CLIP tokenizer assets");
  try {
    real_clip().encode("caf\xC3");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
  }
}

// ---- Bad tokenizer folders: a small valid folder, then one defect at a time. ----

class ClipBadFiles : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fluxmpi_clip_" + std::to_string(::getpid()) + "_" + testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    write_clip_tokenizer({{"c", "a"}, {"ca", "t</w>"}}, dir_.string());
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
  }
  std::string read(const std::string& name) {
    std::ifstream in(dir_ / name, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
  }
  // Loading must throw TokenizerError whose message contains every one of `parts`.
  void expect_error(const std::vector<std::string>& parts) {
    try {
      ClipTokenizer tok(dir_.string(), "model dir '/m': tokenizer");
      ADD_FAILURE() << "loading succeeded; expected a TokenizerError mentioning " << parts[0];
    } catch (const TokenizerError& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }

  fs::path dir_;
};

TEST_F(ClipBadFiles, ValidFolderLoads) {
  ClipTokenizer tok(dir_.string());
  EXPECT_EQ(tok.vocab_size(), 2 * 256 + 2 + 2);
  EXPECT_EQ(tok.tokenize("a cat"), (std::vector<std::string>{"a</w>", "cat</w>"}));
}

TEST_F(ClipBadFiles, MissingVocab) {
  fs::remove(dir_ / "vocab.json");
  expect_error({"model dir '/m': tokenizer/vocab.json", "not found"});
}

TEST_F(ClipBadFiles, DirectoryInsteadOfMerges) {
  fs::remove(dir_ / "merges.txt");
  fs::create_directory(dir_ / "merges.txt");
  expect_error({"tokenizer/merges.txt", "is a directory"});
}

TEST_F(ClipBadFiles, TruncatedVocab) {
  const std::string v = read("vocab.json");
  write("vocab.json", v.substr(0, v.size() / 2));
  expect_error({"tokenizer/vocab.json", "not valid JSON"});
}

TEST_F(ClipBadFiles, VocabNotAnObject) {
  write("vocab.json", "[1, 2, 3]");
  expect_error({"tokenizer/vocab.json", "JSON object"});
}

TEST_F(ClipBadFiles, VocabIdNotAnInteger) {
  write("vocab.json", R"({"a": 0, "b": "one"})");
  expect_error({"tokenizer/vocab.json", "\"b\"", "integer"});
}

TEST_F(ClipBadFiles, VocabWithoutByteSymbols) {
  write("vocab.json", R"({"a": 0, "b": 1, "<|startoftext|>": 2, "<|endoftext|>": 3})");
  expect_error({"tokenizer/vocab.json", "byte symbol"});
}

TEST_F(ClipBadFiles, MergeLineWithThreeSymbols) {
  write("merges.txt", "#version: 0.2\nc a\nca t </w>\n");
  expect_error({"tokenizer/merges.txt", "line 3", "two symbols"});
}

TEST_F(ClipBadFiles, MergeOfUnknownSymbol) {
  write("merges.txt", "#version: 0.2\nc a\nca tt\n");
  expect_error({"tokenizer/merges.txt", "line 3", "\"tt\"", "not in vocab.json"});
}

TEST_F(ClipBadFiles, SpecialTokenNotInVocab) {
  write("special_tokens_map.json", R"({"bos_token": {"content": "<|begin|>"}, "eos_token": "<|endoftext|>",
                                       "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"})");
  expect_error({"tokenizer/special_tokens_map.json", "'bos_token'", "<|begin|>", "not in vocab.json"});
}

TEST_F(ClipBadFiles, SpecialTokenOfWrongType) {
  write("special_tokens_map.json", R"({"eos_token": 7})");
  expect_error({"tokenizer/special_tokens_map.json", "'eos_token'"});
}

TEST_F(ClipBadFiles, SpecialTokensFromConfigWhenMapAbsent) {
  fs::remove(dir_ / "special_tokens_map.json");
  ClipTokenizer tok(dir_.string());
  EXPECT_EQ(tok.bos_id(), tok.vocab_size() - 2);
  EXPECT_EQ(tok.eos_id(), tok.vocab_size() - 1);
}

TEST_F(ClipBadFiles, SpecialTokenMissingEverywhere) {
  fs::remove(dir_ / "special_tokens_map.json");
  write("tokenizer_config.json", R"({"model_max_length": 77, "bos_token": "<|startoftext|>"})");
  expect_error({"model dir '/m': tokenizer", "'eos_token'"});
}

TEST_F(ClipBadFiles, MissingConfig) {
  fs::remove(dir_ / "tokenizer_config.json");
  expect_error({"tokenizer/tokenizer_config.json", "not found"});
}

TEST_F(ClipBadFiles, MaxLengthBelowTwo) {
  write("tokenizer_config.json", R"({"model_max_length": 1})");
  expect_error({"tokenizer/tokenizer_config.json", "model_max_length", "at least 2"});
}

}  // namespace
}  // namespace fluxmpi::text
