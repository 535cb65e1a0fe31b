// The FLUX.1 Redux folder (io/redux_dir.h): the fixture's and the shipped FLUX.1-Redux-dev configs,
// and one clear ConfigError, naming the file and the key, for each way a folder can be wrong.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/redux_dir.h"
#include "support/subtree_cases.h"

namespace fluxmpi::io {
namespace {
namespace fs = std::filesystem;

std::string fixture_redux_dir() {
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(test::project_subtree_manifest("redux")));
  for (const auto& [name, p] : m.at("pipelines").items())
    if (p.value("class", "") == kReduxPipelineClass) return test::project_subtree_dir("redux") + "/" + p.at("path").get<std::string>();
  return {};
}

std::string shipped_redux_dir() { return std::string(FLUXMPI_SOURCE_DIR) + "/share/fluxmpi/models/FLUX.1-Redux-dev"; }

TEST(ReduxDir, ReadsTheFixtureFolderAsItsManifestDescribesIt) {
  const std::string dir = fixture_redux_dir();
  ASSERT_FALSE(dir.empty()) << "no FluxPriorReduxPipeline entry in " << test::project_subtree_manifest("redux");
  const nlohmann::json m = nlohmann::json::parse(std::ifstream(test::project_subtree_manifest("redux")));
  nlohmann::json configs;
  for (const auto& [name, p] : m.at("pipelines").items()) configs = p.at("configs");
  ReduxDir r(dir);
  const auto& enc = configs.at("image_encoder");
  EXPECT_EQ(r.encoder_config().hidden_size, enc.at("hidden_size").get<int64_t>());
  EXPECT_EQ(r.encoder_config().num_hidden_layers, enc.at("num_hidden_layers").get<int64_t>());
  EXPECT_EQ(r.encoder_config().patch_size, enc.at("patch_size").get<int64_t>());
  const int64_t grid = enc.at("image_size").get<int64_t>() / enc.at("patch_size").get<int64_t>();
  EXPECT_EQ(r.image_tokens(), grid * grid);
  EXPECT_EQ(r.processor_config().height, configs.at("feature_extractor").at("size").at("height").get<int64_t>());
  EXPECT_EQ(r.embedder_config().txt_in_features, configs.at("image_embedder").at("txt_in_features").get<int64_t>());
}

TEST(ReduxDir, ReadsTheShippedFluxReduxDevConfigs) {
  ReduxDir r(shipped_redux_dir());
  EXPECT_EQ(r.encoder_config().hidden_size, 1152);
  EXPECT_EQ(r.encoder_config().intermediate_size, 4304);
  EXPECT_EQ(r.encoder_config().num_hidden_layers, 27);
  EXPECT_EQ(r.encoder_config().num_attention_heads, 16);
  EXPECT_EQ(r.image_tokens(), 729);  // (384 // 14)^2: the last 6 pixel rows and columns are not read
  EXPECT_EQ(r.processor_config().resample, Resample::Bicubic);
  EXPECT_DOUBLE_EQ(r.processor_config().rescale_factor, 1.0 / 255.0);
  EXPECT_EQ(r.embedder_config().redux_dim, 1152);
  EXPECT_EQ(r.embedder_config().txt_in_features, 4096);
}

// A writable copy of the shipped folder, changed by `edit` (file -> json).
class BrokenFolder : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fluxmpi_redux_dir_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::copy(shipped_redux_dir(), dir_, fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void edit(const std::string& file, const std::function<void(nlohmann::json&)>& change) {
    const fs::path p = dir_ / file;
    nlohmann::json j = nlohmann::json::parse(std::ifstream(p));
    change(j);
    std::ofstream(p) << j.dump(2);
  }
  // The message of the ConfigError that opening the folder throws.
  std::string error() {
    try {
      ReduxDir r(dir_.string());
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  }
  fs::path dir_;
};

TEST_F(BrokenFolder, NotAReduxPipeline) {
  edit("model_index.json", [](nlohmann::json& j) { j["_class_name"] = "FluxPipeline"; });
  EXPECT_NE(error().find("model_index.json: '_class_name' must be \"FluxPriorReduxPipeline\""), std::string::npos) << error();
}

TEST_F(BrokenFolder, MissingComponent) {
  fs::remove_all(dir_ / "image_embedder");
  EXPECT_NE(error().find("image_embedder/config.json: file not found"), std::string::npos) << error();
}

TEST_F(BrokenFolder, MissingFolder) {
  fs::remove_all(dir_);
  EXPECT_NE(error().find("redux dir '" + dir_.string() + "': not found"), std::string::npos) << error();
}

TEST_F(BrokenFolder, EmbedderWidthDisagreesWithTheEncoder) {
  edit("image_embedder/config.json", [](nlohmann::json& j) { j["redux_dim"] = 1024; });
  EXPECT_NE(error().find("image_embedder/config.json: 'redux_dim' (1024) must equal the image encoder's hidden_size (1152"),
            std::string::npos)
      << error();
}

TEST_F(BrokenFolder, ProcessorSizeGivesOtherPatchCount) {
  edit("feature_extractor/preprocessor_config.json", [](nlohmann::json& j) { j["size"] = {{"height", 224}, {"width", 224}}; });
  EXPECT_NE(error().find("preprocessor_config.json: 'size' 224x224 gives 256 patches of 14 pixels, but the image encoder "
                         "has 729 positions"),
            std::string::npos)
      << error();
}

TEST_F(BrokenFolder, UnsupportedResampleFilter) {
  edit("feature_extractor/preprocessor_config.json", [](nlohmann::json& j) { j["resample"] = 2; });
  EXPECT_NE(error().find("'resample' must be 3 (BICUBIC) or 1 (LANCZOS)"), std::string::npos) << error();
}

TEST_F(BrokenFolder, ShortestEdgeSizeIsRefused) {
  edit("feature_extractor/preprocessor_config.json", [](nlohmann::json& j) { j["size"] = {{"shortest_edge", 384}}; });
  EXPECT_NE(error().find("'size' must give \"height\" and \"width\""), std::string::npos) << error();
}

TEST_F(BrokenFolder, ZeroStandardDeviation) {
  edit("feature_extractor/preprocessor_config.json", [](nlohmann::json& j) { j["image_std"] = {0.5, 0.0, 0.5}; });
  EXPECT_NE(error().find("'image_std' must not contain 0"), std::string::npos) << error();
}

TEST_F(BrokenFolder, HeadsDoNotDivideTheWidth) {
  edit("image_encoder/config.json", [](nlohmann::json& j) { j["num_attention_heads"] = 17; });
  EXPECT_NE(error().find("image_encoder/config.json: 'hidden_size' (1152) must be divisible by num_attention_heads (17)"),
            std::string::npos)
      << error();
}

TEST_F(BrokenFolder, NotASiglipVisionTower) {
  edit("image_encoder/config.json", [](nlohmann::json& j) { j["model_type"] = "clip_vision_model"; });
  EXPECT_NE(error().find("'model_type' must be \"siglip_vision_model\""), std::string::npos) << error();
}

TEST_F(BrokenFolder, IllTypedValue) {
  edit("image_encoder/config.json", [](nlohmann::json& j) { j["num_hidden_layers"] = "27"; });
  EXPECT_NE(error().find("image_encoder/config.json: 'num_hidden_layers' must be a non-negative integer, got \"27\""),
            std::string::npos)
      << error();
}

// transformers' SiglipVisionConfig.from_pretrained reads a full SiglipConfig through its vision_config.
TEST_F(BrokenFolder, FullSiglipConfigIsReadThroughItsVisionConfig) {
  edit("image_encoder/config.json", [](nlohmann::json& j) {
    nlohmann::json vision = j;
    j = {{"model_type", "siglip"}, {"vision_config", vision}, {"text_config", {{"hidden_size", 1152}}}};
  });
  EXPECT_EQ(error(), "no error");
  EXPECT_EQ(ReduxDir(dir_.string()).encoder_config().num_hidden_layers, 27);
}

}  // namespace
}  // namespace fluxmpi::io
