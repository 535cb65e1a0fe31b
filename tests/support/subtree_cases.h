#pragma once
// The cases of a fixture subtree whose manifest lists "pipelines" -> "cases" (image-inputs/,
// flux2/): the parity tests of the VAE encoder, of the image-conditioned pipelines and of the
// FLUX.2 modules and pipelines. Header only.

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/fixtures.h"

namespace fluxmpi::test {

struct SubtreeCase {
  std::string name;       ///< "<pipeline>/<case>"; empty: no manifest (or no case of the kind)
  std::string kind;
  std::string file;       ///< absolute path of the tensors (empty: a case without a tensor file)
  std::string model_dir;  ///< the pipeline folder
  nlohmann::json json;
  std::string subtree;    ///< the subtree folder (absolute)
};
using ImageCase = SubtreeCase;

inline std::string subtree_dir(const std::string& subtree) {
  return (std::filesystem::path(fixture_root()) / subtree).string();
}
inline std::string subtree_manifest(const std::string& subtree) {
  return (std::filesystem::path(subtree_dir(subtree)) / "manifest.json").string();
}
inline std::string image_inputs_subtree() { return subtree_dir("image-inputs"); }
inline std::string image_inputs_manifest() { return subtree_manifest("image-inputs"); }
inline std::string flux2_subtree() { return subtree_dir("flux2"); }
inline std::string flux2_manifest() { return subtree_manifest("flux2"); }

/// The folder of a fixture subtree made by the project's own generators (tools/fixtures/), whose
/// outputs are committed under tests/fixtures/<subtree>: $FLUXMPI_PROJECT_FIXTURES/<subtree> when
/// that variable is set, else <fixture tree>/<subtree> when the shared tree has one (a held-out
/// twin of the same format), else the committed <source>/tests/fixtures/<subtree>.
inline std::string project_subtree_dir(const std::string& subtree) {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("FLUXMPI_PROJECT_FIXTURES"); env && *env)
    return (fs::path(env) / subtree).string();
  std::error_code ec;
  if (fs::is_regular_file(fs::path(subtree_dir(subtree)) / "manifest.json", ec)) return subtree_dir(subtree);
  return (fs::path(FLUXMPI_SOURCE_DIR) / "tests" / "fixtures" / subtree).lexically_normal().string();
}
inline std::string project_subtree_manifest(const std::string& subtree) {
  return (std::filesystem::path(project_subtree_dir(subtree)) / "manifest.json").string();
}

/// The cases of the subtree folder `root` whose kind `keep` accepts; one empty case when there are
/// none (the test then skips, or fails in CI).
inline std::vector<SubtreeCase> subtree_cases_in(const std::string& root_dir,
                                                 const std::function<bool(const std::string& kind)>& keep) {
  namespace fs = std::filesystem;
  std::vector<SubtreeCase> out;
  const fs::path root = root_dir;
  const fs::path manifest_path = root / "manifest.json";
  if (fs::is_regular_file(manifest_path)) {
    const nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest_path));
    for (const auto& [pipeline, p] : m.at("pipelines").items())
      for (const auto& c : p.at("cases")) {
        const std::string kind = c.at("kind").get<std::string>();
        if (!keep(kind)) continue;
        out.push_back({pipeline + "/" + c.at("name").get<std::string>(), kind,
                       c.contains("file") ? (root / c.at("file").get<std::string>()).string() : std::string(),
                       fs::weakly_canonical(root / p.at("path").get<std::string>()).string(), c,
                       fs::weakly_canonical(root).string()});
      }
  }
  if (out.empty()) out.push_back(SubtreeCase{});
  return out;
}
/// The cases of a subtree of the shared fixture tree (image-inputs/, flux2/, ...).
inline std::vector<SubtreeCase> subtree_cases(const std::string& subtree,
                                              const std::function<bool(const std::string& kind)>& keep) {
  return subtree_cases_in(subtree_dir(subtree), keep);
}
/// The cases of a project fixture subtree (project_subtree_dir).
inline std::vector<SubtreeCase> project_subtree_cases(const std::string& subtree,
                                                      const std::function<bool(const std::string& kind)>& keep) {
  return subtree_cases_in(project_subtree_dir(subtree), keep);
}
inline std::vector<SubtreeCase> image_cases(const std::function<bool(const std::string& kind)>& keep) {
  return subtree_cases("image-inputs", keep);
}
inline std::vector<SubtreeCase> flux2_cases(const std::function<bool(const std::string& kind)>& keep) {
  return subtree_cases("flux2", keep);
}

inline std::string image_case_name(const testing::TestParamInfo<SubtreeCase>& info) {
  std::string n = info.param.name.empty() ? "no_manifest" : info.param.name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

inline void PrintTo(const SubtreeCase& c, std::ostream* os) {
  *os << (c.name.empty() ? "<no manifest case>" : c.name);
}

}  // namespace fluxmpi::test

#define REQUIRE_IMAGE_CASE(c)                                                                           \
  do {                                                                                                  \
    FLUXMPI_REQUIRE_FIXTURES();                                                                         \
    if ((c).name.empty()) {                                                                             \
      const std::string why = "no image-inputs case: '" + fluxmpi::test::image_inputs_manifest() +      \
                              "' missing or without this kind";                                         \
      if (fluxmpi::test::running_in_ci()) FAIL() << why;                                                \
      GTEST_SKIP() << why;                                                                              \
    }                                                                                                   \
  } while (0)

/// REQUIRE_IMAGE_CASE for the flux2/ subtree.
#define REQUIRE_FLUX2_CASE(c)                                                                           \
  do {                                                                                                  \
    FLUXMPI_REQUIRE_FIXTURES();                                                                         \
    if ((c).name.empty()) {                                                                             \
      const std::string why = "no flux2 case: '" + fluxmpi::test::flux2_manifest() +                    \
                              "' missing or without this kind";                                         \
      if (fluxmpi::test::running_in_ci()) FAIL() << why;                                                \
      GTEST_SKIP() << why;                                                                              \
    }                                                                                                   \
  } while (0)

/// First statement of a test on a project fixture subtree (project_subtree_dir): the committed
/// fixtures are always there, so a missing manifest or case fails (skips only outside CI, for a
/// FLUXMPI_PROJECT_FIXTURES tree without this subtree).
#define REQUIRE_PROJECT_CASE(c, subtree)                                                                \
  do {                                                                                                  \
    if ((c).name.empty()) {                                                                             \
      const std::string why = std::string("no case of this kind in '") +                                \
                              fluxmpi::test::project_subtree_manifest(subtree) + "'";                   \
      if (fluxmpi::test::running_in_ci() || !std::getenv("FLUXMPI_PROJECT_FIXTURES")) FAIL() << why;   \
      GTEST_SKIP() << why;                                                                              \
    }                                                                                                   \
  } while (0)
