// FLUX.1 Redux at real size without the weights: a hollow FLUX.1-dev (tests/support/hollow_model.h)
// and a hollow FLUX.1-Redux-dev (the shipped configs, weight files whose headers hold every key in
// bf16 over a file hole) through `fluxmpi --dry-run`: the text stream of 512 + 729 tokens, rank 0's
// Redux stage in the plan, the text encoders left out for the zero text, a broken Redux download
// found from its headers.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "app/prepare.h"
#include "core/error.h"
#include "io/redux_dir.h"
#include "io/safetensors_writer.h"
#include "models/siglip/redux_embedder.h"
#include "models/siglip/siglip_vision.h"
#include "support/fixtures.h"
#include "support/hollow_model.h"
#include "support/subtree_cases.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;

// The shipped FLUX.1-Redux-dev configs with hollow bf16 weights (the encoder's head included).
void write_hollow_redux(const fs::path& dir) {
  fs::copy(fs::path(FLUXMPI_SOURCE_DIR) / "share/fluxmpi/models/FLUX.1-Redux-dev", dir, fs::copy_options::recursive);
  const io::ReduxDir r(dir.string());
  io::SafetensorsWriter enc, emb;
  for (const auto& p : siglip::SiglipVisionModel(r.encoder_config())->named_parameters())
    enc.add_hollow(p.key(), io::DType::BF16, p.value().sizes().vec());
  enc.add_hollow("vision_model.head.probe", io::DType::BF16, {1, 1, r.encoder_config().hidden_size});
  enc.write((dir / "image_encoder/model.safetensors").string());
  for (const auto& p : siglip::ReduxImageEncoder(r.embedder_config())->named_parameters())
    emb.add_hollow(p.key(), io::DType::BF16, p.value().sizes().vec());
  emb.write((dir / "image_embedder/diffusion_pytorch_model.safetensors").string());
}

class RealSizeRedux : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("fluxmpi-real-size-redux-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    if (fs::is_directory(fs::path(test::assets_root()) / "configs" / "FLUX.1-dev"))
      model_ = test::write_hollow_model("FLUX.1-dev", (root_ / "FLUX.1-dev").string()).root;
    write_hollow_redux(root_ / "FLUX.1-Redux-dev");
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  void SetUp() override {
    if (model_.empty()) {
      const std::string why = "real FLUX configs not found under '" + test::assets_root() + "/configs'";
      if (test::running_in_ci()) FAIL() << why;
      GTEST_SKIP() << why;
    }
  }
  static std::string redux() { return (root_ / "FLUX.1-Redux-dev").string(); }
  static std::string image() { return test::project_subtree_dir("redux") + "/inputs/photo_100x75.png"; }
  Preparation dry_run(std::vector<std::string> extra, int ranks = 2) {
    std::vector<std::string> a = {"--model", model_, "--dry-run", "--dtype", "bf16", "--redux-model", redux(),
                                  "--redux-image", image()};
    a.insert(a.end(), extra.begin(), extra.end());
    return prepare_run(a, ranks);
  }
  static fs::path root_;
  static std::string model_;
};
fs::path RealSizeRedux::root_;
std::string RealSizeRedux::model_;

TEST_F(RealSizeRedux, ThePlanCountsTheImageTokensAndTheReduxStage) {
  const Preparation p = dry_run({"--prompt", "a cat"});
  EXPECT_NE(p.output.find("per step 4096 image + 1241 text tokens"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("redux: " + redux() + ", 1 image ("), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("729 tokens appended to the prompt"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("encode redux "), std::string::npos) << p.output;
  const parallel::StageEstimate& e0 = p.dry_run_plan->estimate(0);
  // SigLIP 413.0M + embedder 64.5M parameters in bf16, one image's activations, the runtime.
  const uint64_t weights = (412'987'248ull + 64'503'808ull) * 2;
  EXPECT_GT(e0.redux_encode_bytes, weights + parallel::kRuntimeBaselineBytes);
  EXPECT_LT(e0.redux_encode_bytes, weights + parallel::kRuntimeBaselineBytes + (256ull << 20) + e0.job_bytes);
  EXPECT_GT(e0.encode_bytes, e0.redux_encode_bytes);  // T5-XXL's stage stays rank 0's larger one
  // The plain job: 512 text tokens, no Redux stage.
  const Preparation plain = prepare_run({"--model", model_, "--dry-run", "--dtype", "bf16", "--prompt", "a cat"}, 2);
  EXPECT_NE(plain.output.find("per step 4096 image + 512 text tokens"), std::string::npos) << plain.output;
  EXPECT_EQ(plain.dry_run_plan->estimate(0).redux_encode_bytes, 0u);
  EXPECT_GT(e0.activation_bytes, plain.dry_run_plan->estimate(0).activation_bytes);
}

// No prompt: the prior's zeros, no text encoder to hold; schnell's default length becomes 512.
TEST_F(RealSizeRedux, TheZeroTextLoadsNoTextEncoder) {
  const Preparation p = dry_run({});
  EXPECT_NE(p.output.find("729 tokens appended to zeros (no prompt)"), std::string::npos) << p.output;
  EXPECT_EQ(p.dry_run_plan->estimate(0).encode_bytes, 0u) << p.output;
  EXPECT_NE(p.output.find("1241 text tokens"), std::string::npos) << p.output;
}

TEST_F(RealSizeRedux, ABrokenDownloadIsFoundFromItsHeaders) {
  const fs::path broken = root_ / "broken";
  fs::remove_all(broken);
  fs::copy(redux(), broken, fs::copy_options::recursive);
  fs::resize_file(broken / "image_embedder/diffusion_pytorch_model.safetensors", 100);
  try {
    prepare_run({"--model", model_, "--dry-run", "--redux-model", broken.string(), "--redux-image", image()}, 2);
    FAIL() << "no error";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("image_embedder"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fluxmpi::app
