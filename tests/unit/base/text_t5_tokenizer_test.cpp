// T5Tokenizer: exact ids (max_length 512 and 256) and pieces on every case of
// tokenizer_cases.json (the real FLUX.1 tokenizer_2/spiece.model), the quoting of dropped text,
// and one clear error per kind of bad file.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "core/error.h"
#include "support/fixtures.h"
#include "text/t5_tokenizer.h"
#include "text/t5_unigram_trainer.h"

namespace fluxmpi::text {
namespace {
namespace fs = std::filesystem;

std::string t5_assets() { return test::assets_root() + "/tokenizers/t5"; }

const T5Tokenizer& real_t5() {
  static const T5Tokenizer tok(t5_assets());
  return tok;
}

class T5FixtureCase : public testing::TestWithParam<test::TokenizerCase> {};

TEST_P(T5FixtureCase, IdsPiecesAndTruncationMatchReference) {
  FLUXMPI_REQUIRE_FIXTURES();
  ASSERT_FALSE(GetParam().id.empty()) << "no cases in " << test::fixture_root() << "/tokenizer_cases.json";
  FLUXMPI_REQUIRE_ASSET(t5_assets() + "/spiece.model", "T5 tokenizer assets");
  const nlohmann::json& c = GetParam().json;
  const std::string text = c["text"].get<std::string>();
  const std::string where = "tokenizer_cases.json case '" + GetParam().id + "'";
  const int64_t num_tokens = c["t5_num_tokens"].get<int64_t>();

  for (int64_t max_length : {512, 256}) {
    const std::string field = "t5_input_ids_" + std::to_string(max_length);
    const Encoding e = real_t5().encode(text, max_length);
    const auto want = c[field].get<std::vector<int64_t>>();
    EXPECT_EQ(e.ids, want) << where << ": " << field << " differ at " << test::first_difference(e.ids, want);
    EXPECT_EQ(e.num_tokens, num_tokens) << where << ": t5_num_tokens";
    EXPECT_EQ(e.truncated, num_tokens > max_length - 1) << where << ": truncation at " << max_length;
    EXPECT_EQ(e.dropped.empty(), !e.truncated) << where << ": dropped text '" << e.dropped << "'";
  }
  EXPECT_EQ(real_t5().pieces(text), c["t5_pieces"].get<std::vector<std::string>>()) << where << ": t5_pieces";
}

INSTANTIATE_TEST_SUITE_P(TokenizerCases, T5FixtureCase, testing::ValuesIn(test::tokenizer_cases()), test::tokenizer_case_name);

TEST(T5Tokenizer, SpecialIdsComeFromTheModel) {
  FLUXMPI_REQUIRE_ASSET(t5_assets() + "/spiece.model", "T5 tokenizer assets");
  EXPECT_EQ(real_t5().eos_id(), 1);
  EXPECT_EQ(real_t5().pad_id(), 0);
  EXPECT_EQ(real_t5().unk_id(), 2);
  EXPECT_EQ(real_t5().vocab_size(), 32000);
}

std::string repeat(const std::string& piece, int n, const std::string& sep = " ") {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? sep : "") + piece;
  return s;
}

TEST(T5Tokenizer, DroppedTextQuotesWholeWordsAfterTheCut) {
  FLUXMPI_REQUIRE_ASSET(t5_assets() + "/spiece.model", "T5 tokenizer assets");
  // "▁cat" is one piece: 300 of them, 255 fit before EOS at max_length 256.
  const Encoding e = real_t5().encode(repeat("cat", 300), 256);
  EXPECT_TRUE(e.truncated);
  EXPECT_EQ(e.num_tokens, 300);
  EXPECT_EQ(e.dropped, repeat("cat", 45));
  EXPECT_EQ(e.ids.back(), 1);
  EXPECT_FALSE(real_t5().encode(repeat("cat", 255), 256).truncated);
  EXPECT_EQ(real_t5().encode(repeat("cat", 256), 256).dropped, "cat");
}

TEST(T5Tokenizer, DroppedTextStartsInsideASplitWord) {
  FLUXMPI_REQUIRE_ASSET(t5_assets() + "/spiece.model", "T5 tokenizer assets");
  // ▁super|cali|frag|il|istic|...: only "▁super" fits after 254 words.
  EXPECT_EQ(real_t5().encode(repeat("cat", 254) + " supercalifragilisticexpialidocious", 256).dropped,
            "califragilisticexpialidocious");
}

TEST(T5Tokenizer, DroppedTextIsTheOriginalUnnormalisedText) {
  FLUXMPI_REQUIRE_ASSET(t5_assets() + "/spiece.model", "T5 tokenizer assets");
  // nmt_nfkc turns the fullwidth letters into "▁ABC" "123"; the quote keeps what the user wrote.
  const std::string tail = "\xEF\xBC\xA1\xEF\xBC\xA2\xEF\xBC\xA3\xEF\xBC\x91\xEF\xBC\x92\xEF\xBC\x93  and   more";
  const Encoding e = real_t5().encode(repeat("cat", 255) + "   " + tail + "  ", 256);
  EXPECT_EQ(e.dropped, tail);
}

TEST(T5Tokenizer, MaxLengthBelowTwoIsAnError) {
  FLUXMPI_REQUIRE_ASSET(t5_assets() + "/spiece.model", "T5 tokenizer assets");
  EXPECT_EQ(real_t5().encode("a cat", 2).ids, (std::vector<int64_t>{3, 1}));
  EXPECT_THROW(real_t5().encode("a cat", 1), TokenizerError);
}

// ---- Bad tokenizer folders ----

class T5BadFiles : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = fs::temp_directory_path() / ("fluxmpi_t5_model_" + std::to_string(::getpid()));
    train_t5_unigram(std::string(FLUXMPI_SOURCE_DIR) + "/tools/make_tiny_model/corpus.txt", 300, model_dir_.string());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fluxmpi_t5_" + std::to_string(::getpid()) + "_" + testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::copy(model_dir_, dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
  }
  void expect_error(const std::vector<std::string>& parts) {
    try {
      T5Tokenizer tok(dir_.string(), "model dir '/m': tokenizer_2");
      ADD_FAILURE() << "loading succeeded; expected a TokenizerError mentioning " << parts[0];
    } catch (const TokenizerError& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }

  static fs::path model_dir_;
  fs::path dir_;
};
fs::path T5BadFiles::model_dir_;

TEST_F(T5BadFiles, ValidFolderLoads) {
  T5Tokenizer tok(dir_.string());
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
}

TEST_F(T5BadFiles, MissingModel) {
  fs::remove(dir_ / "spiece.model");
  expect_error({"model dir '/m': tokenizer_2/spiece.model", "not found"});
}

TEST_F(T5BadFiles, DirectoryInsteadOfModel) {
  fs::remove(dir_ / "spiece.model");
  fs::create_directory(dir_ / "spiece.model");
  expect_error({"tokenizer_2/spiece.model", "is a directory"});
}

TEST_F(T5BadFiles, GarbageModel) {
  write("spiece.model", "this is not a protobuf \x01\x02\x03\xff\xfe");
  // sentencepiece's own status message is part of ours.
  expect_error({"tokenizer_2/spiece.model", "not a sentencepiece model", "Internal"});
}

TEST_F(T5BadFiles, SpecialTokensMapContradictsModel) {
  write("special_tokens_map.json", R"({"eos_token": {"content": "<eos>"}})");
  expect_error({"tokenizer_2/special_tokens_map.json", "'eos_token'", "<eos>", "</s>"});
}

TEST_F(T5BadFiles, TruncatedConfig) {
  write("tokenizer_config.json", R"({"eos_token": "</)");
  expect_error({"tokenizer_2/tokenizer_config.json", "not valid JSON"});
}

TEST_F(T5BadFiles, JsonFilesAreOptional) {
  fs::remove(dir_ / "special_tokens_map.json");
  fs::remove(dir_ / "tokenizer_config.json");
  EXPECT_EQ(T5Tokenizer(dir_.string()).eos_id(), 1);
}

}  // namespace
}  // namespace fluxmpi::text
