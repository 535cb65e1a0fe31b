#pragma once
// The reference fixture tree (../shared/fixtures or $FLUXMPI_FIXTURES) and its manifest.
// A missing tree skips the tests that need it, saying where it looked, except when CI=true,
// where it fails them.

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fluxmpi::test {

/// Where the fixture tree is expected: $FLUXMPI_FIXTURES, else <source>/../shared/fixtures.
std::string fixture_root();
/// Where the shared assets are expected: $FLUXMPI_ASSETS, else <source>/../shared/assets.
std::string assets_root();
bool fixtures_present();
bool running_in_ci();
/// The parsed manifest.json (throws when absent; check fixtures_present() first).
const nlohmann::json& manifest();

/// One case of the manifest.
struct CaseRef {
  std::string pipeline;     ///< e.g. "tiny-flux-dev"; empty for the "no fixtures" placeholder
  std::string name;         ///< e.g. "sq64_s4_g3.5_seed0"
  std::string kind;
  std::string file;         ///< absolute path of the case's tensor file
  std::string model_dir;    ///< absolute path of the pipeline folder
  nlohmann::json json;      ///< the case entry of the manifest
  nlohmann::json pipeline_json;
};

/// All cases of a kind, in manifest order. Without a fixture tree: one placeholder case whose
/// test then skips or fails through FLUXMPI_REQUIRE_CASE.
std::vector<CaseRef> cases_of_kind(const std::string& kind);
/// gtest parameter names: "tiny_flux_dev__sq64_s4_g3_5_seed0".
std::string case_test_name(const testing::TestParamInfo<CaseRef>& info);
/// "tiny-flux-dev/sq64_s4_g3.5_seed0"
std::string case_label(const CaseRef& c);
/// How gtest prints a case parameter (in test listings and failures).
void PrintTo(const CaseRef& c, std::ostream* os);

std::string missing_fixtures_message();

/// The cases of single-file/manifest.json (the fixtures' weights as community files). For each:
/// `file` = the case's tensors, `model_dir` = the config folder to pass as --model-config,
/// `pipeline_json` = the manifest entry ("files": the files; "files_dir"), `name` = the case name,
/// `kind` = "files" or "fp8-all" (which weights). Without that manifest: one placeholder case.
std::vector<CaseRef> single_file_cases();
/// The folder of a single-file entry's files (single-file/<files_dir>).
std::string single_file_dir(const CaseRef& c);
/// single-file/manifest.json exists under the fixture tree.
bool single_file_fixtures_present();

/// One case of tokenizer_cases.json; an empty id stands for "no fixture file".
struct TokenizerCase {
  std::string id;
  nlohmann::json json;
};
/// Every case of tokenizer_cases.json; without the file, one placeholder (empty id).
std::vector<TokenizerCase> tokenizer_cases();
/// gtest parameter names: the case id with every non-alphanumeric character as '_'.
std::string tokenizer_case_name(const testing::TestParamInfo<TokenizerCase>& info);
void PrintTo(const TokenizerCase& c, std::ostream* os);

/// The first position where two id lists differ, for a readable failure.
std::string first_difference(const std::vector<int64_t>& got, const std::vector<int64_t>& want);

}  // namespace fluxmpi::test

/// Skips (fails under CI=true) when `file`, one of the shared assets that live outside the
/// project, is missing; `what` names it ("CLIP tokenizer assets").
#define FLUXMPI_REQUIRE_ASSET(file, what)                                                 \
  do {                                                                                    \
    if (!std::filesystem::is_regular_file(file)) {                                        \
      const std::string why = std::string(what) + " not found: '" + (file) + "'";         \
      if (::fluxmpi::test::running_in_ci()) FAIL() << why;                                \
      GTEST_SKIP() << why;                                                                \
    }                                                                                     \
  } while (0)

/// First statement of a parity test: skips (or fails under CI=true) without the fixture tree.
#define FLUXMPI_REQUIRE_FIXTURES()                                                        \
  do {                                                                                    \
    if (!::fluxmpi::test::fixtures_present()) {                                           \
      if (::fluxmpi::test::running_in_ci()) FAIL() << ::fluxmpi::test::missing_fixtures_message(); \
      GTEST_SKIP() << ::fluxmpi::test::missing_fixtures_message();                        \
    }                                                                                     \
  } while (0)

/// First statement of a single-file test: skips (fails under CI=true) without single-file/manifest.json.
#define FLUXMPI_REQUIRE_SINGLE_FILE_CASE(c)                                                \
  do {                                                                                    \
    if (!::fluxmpi::test::single_file_fixtures_present()) {                               \
      const std::string why = "single-file fixtures not found: no single-file/manifest.json in '" + \
                              ::fluxmpi::test::fixture_root() + "' (set FLUXMPI_FIXTURES; under CI=true this is a failure)"; \
      if (::fluxmpi::test::running_in_ci()) FAIL() << why;                               \
      GTEST_SKIP() << why;                                                                \
    }                                                                                     \
    ASSERT_FALSE((c).pipeline.empty()) << "no case in single-file/manifest.json";         \
  } while (0)

#define FLUXMPI_REQUIRE_CASE(c)                                                            \
  do {                                                                                    \
    FLUXMPI_REQUIRE_FIXTURES();                                                           \
    ASSERT_FALSE((c).pipeline.empty()) << "no case of this kind in the manifest";        \
  } while (0)
