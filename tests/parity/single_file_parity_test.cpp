// Single-file checkpoints (single-file/manifest.json) against diffusers: every case of the
// manifest runs the whole pipeline in one process from the community files, with the checks of
// the pipeline parity test (pipeline_case.h), and every tensor the files present under a diffusers
// key equals the diffusers folder's (bit for bit in fp32; the fp16 text encoders equal the folder's
// values rounded to fp16).

#include <gtest/gtest.h>

#include <filesystem>

#include "io/model_dir.h"
#include "models/common/tensor_utils.h"
#include "pipeline_case.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

namespace fs = std::filesystem;

// The sources a case's weights come from, as check-cli-extra.sh passes them.
io::ModelSources sources_of(const test::CaseRef& c) {
  const std::string dir = test::single_file_dir(c);
  const auto& files = c.pipeline_json["files"];
  io::ModelSources s;
  if (c.kind == "fp8-all") {
    s.model = dir + "/" + files["all_in_one_fp8"].get<std::string>();
  } else {
    s.model = dir + "/" + files["transformer"].get<std::string>();
    s.vae = dir + "/" + files["vae"].get<std::string>();
    s.text_encoder = dir + "/" + files["text_encoder"].get<std::string>();
    s.text_encoder_2 = dir + "/" + files["text_encoder_2"].get<std::string>();
  }
  s.model_config = c.model_dir;
  return s;
}

class SingleFileParity : public testing::TestWithParam<test::CaseRef> {};

TEST_P(SingleFileParity, WholeRunMatchesDiffusers) {
  const test::CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_SINGLE_FILE_CASE(c);
  io::ModelDir dir(sources_of(c));
  check_pipeline_run(dir, c, test::fixture_root() + "/single-file");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SingleFileParity, testing::ValuesIn(test::single_file_cases()), test::case_test_name);

// The separate files hold the diffusers folder's weights: the transformer (original keys) and the
// VAE (LDM keys) in fp32, the text encoders in fp16. Every diffusers key the folder has is
// presented by the file with the same value; the files present nothing else the models load.
TEST(SingleFileWeights, SeparateFilesPresentTheFolderWeights) {
  const auto cases = test::single_file_cases();
  FLUXMPI_REQUIRE_SINGLE_FILE_CASE(cases.front());
  const test::CaseRef* files_case = nullptr;
  for (const auto& c : cases)
    if (c.kind == "files") files_case = &c;
  ASSERT_NE(files_case, nullptr) << "no 'files' case in single-file/manifest.json";
  io::ModelDir single(sources_of(*files_case));
  io::ModelDir folder(fs::path(test::fixture_root()) / files_case->pipeline_json["source_pipeline"].get<std::string>());
  for (const char* component : {"transformer", "vae", "text_encoder", "text_encoder_2"}) {
    io::TensorStore a = single.open_weights(component);
    io::TensorStore b = folder.open_weights(component);
    int64_t compared = 0;
    for (const auto& key : b.keys()) {
      // The VAE's encoder never runs; the file keeps it in its LDM names.
      if (std::string(component) == "vae" && key.rfind("encoder.", 0) == 0) continue;
      ASSERT_TRUE(a.contains(key)) << component << ": the single file presents no '" << key << "'";
      at::Tensor want = nn::read_tensor(b, key, at::kFloat, at::kCPU);
      const io::DType stored = a.get(key).pieces.front().entry->dtype;
      if (stored == io::DType::F16) want = want.to(at::kHalf).to(at::kFloat);
      at::Tensor got = nn::read_tensor(a, key, at::kFloat, at::kCPU);
      EXPECT_TRUE(test::identical(std::string(component) + "/" + key, got, want));
      ++compared;
    }
    EXPECT_GT(compared, 0) << component;
    // Nothing else, but the VAE's encoder: fluxmpi never runs it and presents it in its LDM names.
    for (const auto& key : a.keys()) {
      if (std::string(component) == "vae" && key.rfind("encoder.", 0) == 0) continue;
      EXPECT_TRUE(b.contains(key)) << component << ": the single file presents '" << key << "', the folder has no such key";
    }
  }
}

}  // namespace
}  // namespace fluxmpi::pipeline
