// The sentencepiece loader (text/sentencepiece_loader.h): the shim is found and kept out of the
// global symbol scope, the C++ wrapper gives ids, pieces and byte offsets into the original
// text, and each way of not finding or not loading the shim is one clear TokenizerError.

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <unistd.h>

#include "core/error.h"
#include "support/fixtures.h"
#include "text/sentencepiece_loader.h"

namespace fluxmpi::text {
namespace {
namespace fs = std::filesystem;

const std::string kRealModel = test::assets_root() + "/tokenizers/t5/spiece.model";
const std::string kCorpus = std::string(FLUXMPI_SOURCE_DIR) + "/tools/make_tiny_model/corpus.txt";

#define REQUIRE_REAL_MODEL()                                                          \
  do {                                                                                \
    if (!fs::is_regular_file(kRealModel)) {                                           \
      const std::string why = "T5 tokenizer model not found: '" + kRealModel + "'";  \
      if (test::running_in_ci()) FAIL() << why;                                       \
      GTEST_SKIP() << why;                                                            \
    }                                                                                 \
  } while (0)

TEST(SentencePieceLoader, LoadsTheShimWithoutExportingItsSymbols) {
  const SentencePieceRuntime& rt = sentencepiece_runtime();
  EXPECT_TRUE(fs::is_regular_file(rt.path)) << rt.path;
  EXPECT_EQ(fs::path(rt.path).filename(), "libfluxmpi_spm.so");
  // RTLD_LOCAL (and, outside sanitizer builds, a namespace of its own): nothing of the shim or
  // of sentencepiece is visible to the program's own symbol lookups.
  EXPECT_EQ(::dlsym(RTLD_DEFAULT, "fluxmpi_spm_open"), nullptr);
  if (rt.own_namespace) {
    EXPECT_EQ(::dlopen("libsentencepiece.so.0", RTLD_NOW | RTLD_NOLOAD), nullptr)
        << "libsentencepiece is in the program's link namespace";
  }
}

TEST(SentencePieceModel, SpecialIdsPiecesAndIds) {
  REQUIRE_REAL_MODEL();
  const SentencePieceModel m(kRealModel, "t5/spiece.model");
  EXPECT_EQ(m.vocab_size(), 32000);
  EXPECT_EQ(m.pad_id(), 0);
  EXPECT_EQ(m.eos_id(), 1);
  EXPECT_EQ(m.unk_id(), 2);
  EXPECT_EQ(m.bos_id(), -1);
  EXPECT_EQ(m.id_to_piece(1), "</s>");
  EXPECT_EQ(m.id_to_piece(1202), "\xE2\x96\x81photo");
  EXPECT_EQ(m.piece_to_id("\xE2\x96\x81photo"), 1202);
  EXPECT_EQ(m.piece_to_id("no such piece"), m.unk_id());
  EXPECT_THROW(m.id_to_piece(32000), InternalError);
  EXPECT_THROW(m.id_to_piece(-1), InternalError);
}

TEST(SentencePieceModel, PiecesCarryByteRangesOfTheOriginalText) {
  REQUIRE_REAL_MODEL();
  const SentencePieceModel m(kRealModel, "t5/spiece.model");
  // Leading spaces, a fullwidth "ＡＢＣ" (3 bytes a letter) that nmt_nfkc folds to "▁ABC", and "ß".
  const std::string text = "  A photo \xEF\xBC\xA1\xEF\xBC\xA2\xEF\xBC\xA3 Stra\xC3\x9F" "e";
  const std::vector<SentencePiece> pieces = m.encode(text);
  std::vector<std::string> got;
  for (const SentencePiece& p : pieces) {
    EXPECT_EQ(m.id_to_piece(p.id), p.piece);
    got.push_back(p.piece + "@" + std::to_string(p.begin) + "-" + std::to_string(p.end));
  }
  EXPECT_EQ(got, (std::vector<std::string>{"\xE2\x96\x81" "A@2-3", "\xE2\x96\x81photo@3-9",
                                           "\xE2\x96\x81" "ABC@9-19", "\xE2\x96\x81Stra@19-24", "\xC3\x9F@24-26",
                                           "e@26-27"}));
  EXPECT_TRUE(m.encode("").empty());
}

TEST(SentencePieceModel, MovesOwnership) {
  REQUIRE_REAL_MODEL();
  SentencePieceModel a(kRealModel, "a");
  SentencePieceModel b(std::move(a));
  EXPECT_EQ(b.vocab_size(), 32000);
  SentencePieceModel c(kRealModel, "c");
  c = std::move(b);
  EXPECT_EQ(c.encode("a cat").size(), 3u);
}

TEST(SentencePieceModel, NotAModelNamesTheLabelAndSentencepiecesReason) {
  const fs::path bad = fs::temp_directory_path() / ("fluxmpi_spm_bad_" + std::to_string(::getpid()));
  std::ofstream(bad, std::ios::binary) << "not a model";
  try {
    SentencePieceModel m(bad.string(), "model dir '/m': tokenizer_2/spiece.model");
    ADD_FAILURE() << "a text file loaded as a sentencepiece model";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("model dir '/m': tokenizer_2/spiece.model: not a sentencepiece model: "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("Internal"), std::string::npos) << e.what();
  }
  fs::remove(bad);
}

TEST(SentencePieceTrainer, BadOptionIsAUsageErrorWithSentencepiecesMessage) {
  try {
    train_sentencepiece({{"input", kCorpus}, {"no_such_flag", "1"}}, 1, "training X");
    ADD_FAILURE() << "training with an unknown option succeeded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("training X failed: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no_such_flag"), std::string::npos) << e.what();
  }
}

// ---- Finding and loading the shim: each in a fresh process, since a process loads it once ----

// Loads the shim with FLUXMPI_SPM_LIBRARY=`path`; exits 3 printing the TokenizerError, 0 if it
// loaded.
[[noreturn]] void load_with_env(const std::string& path) {
  ::setenv("FLUXMPI_SPM_LIBRARY", path.c_str(), 1);
  try {
    sentencepiece_runtime();
  } catch (const TokenizerError& e) {
    std::cerr << "TokenizerError: " << e.what() << std::endl;
    std::_Exit(3);
  }
  std::_Exit(0);
}

class SentencePieceShimSearch : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(SentencePieceShimSearch, EnvironmentOverridesTheBuiltPath) {
  const std::string built = sentencepiece_runtime().path;
  EXPECT_EXIT(load_with_env(built), testing::ExitedWithCode(0), "");
}

TEST_F(SentencePieceShimSearch, MissingFileNamesTheVariable) {
  EXPECT_EXIT(load_with_env("/nonexistent/libfluxmpi_spm.so"), testing::ExitedWithCode(3),
              "sentencepiece shim not found: FLUXMPI_SPM_LIBRARY='/nonexistent/libfluxmpi_spm.so' is not a file");
}

TEST_F(SentencePieceShimSearch, UnloadableFileGivesTheLoadersReason) {
  const fs::path bad = fs::temp_directory_path() / ("fluxmpi_spm_notelf_" + std::to_string(::getpid()) + ".so");
  std::ofstream(bad, std::ios::binary) << std::string(4096, 'x');  // long enough to have a header
  EXPECT_EXIT(load_with_env(bad.string()), testing::ExitedWithCode(3),
              "cannot load the sentencepiece shim '.*fluxmpi_spm_notelf_[0-9]+[.]so'.*: invalid ELF header");
  fs::remove(bad);
}

TEST_F(SentencePieceShimSearch, LibraryWithoutTheInterfaceIsRefused) {
  // Any other shared library: the C++ runtime this test links.
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&std::terminate), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  EXPECT_EXIT(load_with_env(info.dli_fname), testing::ExitedWithCode(3),
              "lacks 'fluxmpi_spm_abi_version'.*rebuild target fluxmpi_spm");
}

}  // namespace
}  // namespace fluxmpi::text
