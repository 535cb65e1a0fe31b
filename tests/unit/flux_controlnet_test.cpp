// FluxControlNetModel loading: the fixture nets' keys are exactly the module's, and a folder whose
// weights do not fit its config is a WeightError naming the key and the folder, found from the
// headers (check_controlnet_weights) before anything is loaded.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/flux/controlnet.h"
#include "support/controlnet_cases.h"

namespace fluxmpi::flux {
namespace {

namespace fs = std::filesystem;

// A copy of a fixture ControlNet with its config changed.
std::string changed_copy(const std::string& from, const std::string& name, const std::function<void(nlohmann::json&)>& change) {
  const fs::path to = fs::temp_directory_path() / ("fluxmpi-controlnet-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(to);
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), to / e.path().filename());
  nlohmann::json config = nlohmann::json::parse(std::ifstream(to / "config.json"));
  change(config);
  std::ofstream(to / "config.json") << config.dump(2);
  return to.string();
}

std::string weight_error(const std::string& dir) {
  try {
    check_controlnet_weights(dir);
  } catch (const WeightError& e) {
    return e.what();
  }
  return "(no WeightError)";
}

class ControlNetFolders : public testing::TestWithParam<test::SubtreeCase> {};

TEST_P(ControlNetFolders, KeysAreTheModulesAndMisfitsAreNamed) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, test::kControlNetSubtree);
  const std::string dir = test::controlnet_dir(c, c.json.at("net"));
  check_controlnet_weights(dir);  // every key claimed, every shape right
  const FluxControlNet net = load_flux_controlnet(dir, at::kFloat, at::kCPU);
  EXPECT_EQ(net->config().num_blocks(), static_cast<int64_t>(net->double_blocks.size() + net->single_blocks.size()));

  // One more double block than stored: its first key is missing.
  const std::string deeper = changed_copy(dir, "deeper", [](nlohmann::json& j) { j["num_layers"] = j["num_layers"].get<int>() + 1; });
  const std::string missing = weight_error(deeper);
  EXPECT_NE(missing.find("transformer_blocks."), std::string::npos) << missing;
  EXPECT_NE(missing.find(deeper), std::string::npos) << missing;
  // Fewer single blocks than stored: a stored key no parameter claims.
  if (net->config().num_single_layers > 0) {
    const std::string shallower = changed_copy(dir, "shallower", [](nlohmann::json& j) {
      j["num_single_layers"] = j["num_single_layers"].get<int>() - 1;
      if (j["num_layers"].get<int>() + j["num_single_layers"].get<int>() == 0) j["num_layers"] = 1;
    });
    const std::string unclaimed = weight_error(shallower);
    EXPECT_NE(unclaimed.find("single_blocks."), std::string::npos) << unclaimed;
    EXPECT_NE(unclaimed.find("no parameter of the model claims it"), std::string::npos) << unclaimed;
  }
  // A wider model: shapes differ.
  const std::string wider = changed_copy(dir, "wider", [](nlohmann::json& j) { j["joint_attention_dim"] = 48; });
  EXPECT_NE(weight_error(wider).find("context_embedder.weight"), std::string::npos) << weight_error(wider);
  fs::remove_all(fs::path(deeper).parent_path());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ControlNetFolders, testing::ValuesIn(test::controlnet_cases("controlnet_forward")),
                         test::image_case_name);

}  // namespace
}  // namespace fluxmpi::flux
