#pragma once
// The cases of the ControlNet fixture subtree (tests/fixtures/controlnet, made by
// tools/fixtures/controlnet.py; a held-out twin under the shared tree first): where a case's
// ControlNets, base pipeline and control images are, and the check that a test's tolerance lies
// above every reference's recorded distance to float64. Header only.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/fixtures.h"
#include "support/subtree_cases.h"

namespace fluxmpi::test {

inline constexpr const char* kControlNetSubtree = "controlnet";

inline std::vector<SubtreeCase> controlnet_cases(const std::string& kind) {
  return project_subtree_cases(kControlNetSubtree, [&](const std::string& k) { return k == kind; });
}

/// The folder of the ControlNet `name` of the case's subtree (the manifest's nets.<name>.path).
inline std::string controlnet_dir(const SubtreeCase& c, const std::string& name) {
  namespace fs = std::filesystem;
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(fs::path(c.subtree) / "manifest.json"));
  return (fs::path(c.subtree) / m.at("nets").at(name).at("path").get<std::string>()).string();
}

/// The case's base pipeline: a folder of the shared fixture tree.
inline std::string controlnet_base_dir(const SubtreeCase& c) {
  return (std::filesystem::path(fixture_root()) / c.json.at("pipeline_dir").get<std::string>()).string();
}

/// A path of the case's subtree (control images: "inputs/edges_64x64.png").
inline std::string controlnet_path(const SubtreeCase& c, const std::string& relative) {
  return (std::filesystem::path(c.subtree) / relative).string();
}

/// A tolerance must lie above the reference's own error: every tensor's recorded distance to a
/// float64 recomputation stays below `tol`.
inline testing::AssertionResult tolerance_above_f64(const SubtreeCase& c, double tol) {
  for (const auto& [name, t] : c.json.at("tensors").items()) {
    const double d = t.value("f64_distance", 0.0);
    if (d >= tol)
      return testing::AssertionFailure() << c.name << ": " << name << " is " << d << " from float64, not below the "
                                         << "tolerance " << tol;
  }
  return testing::AssertionSuccess();
}

}  // namespace fluxmpi::test
