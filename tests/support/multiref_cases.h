#pragma once
// The cases of the FLUX.2 multi-reference fixture subtree (tests/fixtures/flux2-multiref, made by
// tools/fixtures/flux2_multiref.py; a held-out twin under the shared tree first): where a case's
// pipeline and reference images are, and the check that a test's tolerance lies above every
// reference tensor's recorded distance to float64. Header only.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/fixtures.h"
#include "support/subtree_cases.h"

namespace fluxmpi::test {

inline constexpr const char* kMultirefSubtree = "flux2-multiref";

inline std::vector<SubtreeCase> multiref_cases(const std::string& kind) {
  return project_subtree_cases(kMultirefSubtree, [&](const std::string& k) { return k == kind; });
}

/// The case's FLUX.2 pipeline: a folder of the shared fixture tree.
inline std::string multiref_pipeline_dir(const SubtreeCase& c) {
  return (std::filesystem::path(fixture_root()) / c.json.at("pipeline_dir").get<std::string>()).string();
}

/// A path of the case's subtree ("inputs/ref_a_80x64.png").
inline std::string multiref_path(const SubtreeCase& c, const std::string& relative) {
  return (std::filesystem::path(c.subtree) / relative).string();
}

/// The case's reference images (call.images, or a vae_encode case's inputs), as paths.
inline std::vector<std::string> multiref_images(const SubtreeCase& c) {
  const auto& names = c.json.contains("call") ? c.json.at("call").at("images") : c.json.at("inputs");
  std::vector<std::string> out;
  for (const auto& n : names) out.push_back(multiref_path(c, "inputs/" + n.get<std::string>()));
  return out;
}

/// A tolerance must lie above each reference's own error: every tensor's recorded distance to a
/// float64 recomputation stays below `tol`.
inline testing::AssertionResult tolerance_above_reference_error(const SubtreeCase& c, double tol) {
  for (const auto& [name, t] : c.json.at("tensors").items()) {
    const double d = t.value("f64_distance", 0.0);
    if (d >= tol)
      return testing::AssertionFailure() << c.name << ": " << name << " is " << d << " from float64, not below the "
                                         << "tolerance " << tol;
  }
  return testing::AssertionSuccess();
}

}  // namespace fluxmpi::test
