#pragma once
// The cases of the image-inputs fixture subtree (../shared/fixtures/image-inputs/manifest.json),
// for the parity tests of the VAE encoder and of the image-conditioned pipelines. Header only.

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/fixtures.h"

namespace fluxmpi::test {

struct ImageCase {
  std::string name;       ///< "<pipeline>/<case>"; empty: no image-inputs manifest
  std::string kind;
  std::string file;       ///< absolute path of the tensors
  std::string model_dir;  ///< the pipeline folder
  nlohmann::json json;
};

inline std::string image_inputs_subtree() {
  return (std::filesystem::path(fixture_root()) / "image-inputs").string();
}
inline std::string image_inputs_manifest() {
  return (std::filesystem::path(image_inputs_subtree()) / "manifest.json").string();
}

/// The cases whose kind `keep` accepts; one empty case when there are none (the test then skips,
/// or fails in CI).
inline std::vector<ImageCase> image_cases(const std::function<bool(const std::string& kind)>& keep) {
  namespace fs = std::filesystem;
  std::vector<ImageCase> out;
  if (fs::is_regular_file(image_inputs_manifest())) {
    const nlohmann::json m = nlohmann::json::parse(std::ifstream(image_inputs_manifest()));
    for (const auto& [pipeline, p] : m.at("pipelines").items())
      for (const auto& c : p.at("cases")) {
        const std::string kind = c.at("kind").get<std::string>();
        if (!keep(kind)) continue;
        out.push_back({pipeline + "/" + c.at("name").get<std::string>(), kind,
                       (fs::path(image_inputs_subtree()) / c.at("file").get<std::string>()).string(),
                       fs::weakly_canonical(fs::path(image_inputs_subtree()) / p.at("path").get<std::string>()).string(), c});
      }
  }
  if (out.empty()) out.push_back(ImageCase{});
  return out;
}

inline std::string image_case_name(const testing::TestParamInfo<ImageCase>& info) {
  std::string n = info.param.name.empty() ? "no_manifest" : info.param.name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

inline void PrintTo(const ImageCase& c, std::ostream* os) {
  *os << (c.name.empty() ? "<no image-inputs manifest>" : c.name);
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
