// FLUX.2 reference images before the VAE (pipeline/flux2/references.h) against diffusers 0.40's own
// code (tests/fixtures/flux2-multiref, tools/fixtures/flux2_multiref.py): the processor's bounds,
// the area cap and the floor for a table of sizes; the pixels of a reference over 1024 x 1024
// pixels after the LANCZOS cap and the center crop (exact integer checksums); the position ids of
// every pipeline case's references, bit for bit.

#include <gtest/gtest.h>

#include "core/error.h"
#include "io/image_file.h"
#include "io/json_config.h"
#include "models/flux2/vae.h"
#include "pipeline/flux2/references.h"
#include "support/multiref_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {

using test::SubtreeCase;

const SubtreeCase& single_case(const char* kind) {
  static std::map<std::string, SubtreeCase> cases;
  auto it = cases.find(kind);
  if (it == cases.end()) it = cases.emplace(kind, test::multiref_cases(kind).front()).first;
  return it->second;
}

TEST(Flux2References, SizesAsDiffusersComputesThem) {
  const SubtreeCase& c = single_case("reference_sizes");
  REQUIRE_PROJECT_CASE(c, test::kMultirefSubtree);
  const int64_t unit = c.json.at("unit").get<int64_t>();
  for (const auto& row : c.json.at("sizes")) {
    const int64_t w = row.at("width").get<int64_t>(), h = row.at("height").get<int64_t>();
    const std::string what = str_cat(w, "x", h);
    if (row.contains("error")) {
      EXPECT_THROW(check_reference_image("--image", "x.png", h, w), ImageError) << what << ": " << row.at("error");
      continue;
    }
    EXPECT_NO_THROW(check_reference_image("--image", "x.png", h, w)) << what;
    PixelSize capped;
    const PixelSize size = reference_size(h, w, unit, &capped);
    EXPECT_EQ(capped.width, row.at("capped").at(0).get<int64_t>()) << what;
    EXPECT_EQ(capped.height, row.at("capped").at(1).get<int64_t>()) << what;
    EXPECT_EQ(size.width, row.at("encoded").at(0).get<int64_t>()) << what;
    EXPECT_EQ(size.height, row.at("encoded").at(1).get<int64_t>()) << what;
  }
}

TEST(Flux2References, LargeReferenceIsCappedAndCroppedAsPillowDoes) {
  const SubtreeCase& c = single_case("reference_pixels");
  REQUIRE_PROJECT_CASE(c, test::kMultirefSubtree);
  const io::Image8 pixels =
      reference_pixels(io::read_image(test::multiref_path(c, c.json.at("input").get<std::string>())), c.json.at("unit"));
  ASSERT_EQ(pixels.height, c.json.at("encoded_hw").at(0).get<int64_t>());
  ASSERT_EQ(pixels.width, c.json.at("encoded_hw").at(1).get<int64_t>());
  // The integer checksums the generator took of diffusers' pixels.
  constexpr uint64_t kMod = (uint64_t{1} << 61) - 1;
  for (int ch = 0; ch < 3; ++ch) {
    uint64_t sum = 0;
    unsigned __int128 weighted = 0;
    for (int y = 0; y < pixels.height; ++y)
      for (int x = 0; x < pixels.width; ++x) {
        const uint64_t v = pixels.at(y, x, ch);
        sum += v;
        weighted += static_cast<unsigned __int128>(static_cast<uint64_t>(y) * pixels.width + x + 1) * v;
      }
    EXPECT_EQ(sum, c.json.at("checksums").at("sum").at(ch).get<uint64_t>()) << "channel " << ch;
    EXPECT_EQ(static_cast<uint64_t>(weighted % kMod), c.json.at("checksums").at("weighted_sum_mod_2_61").at(ch).get<uint64_t>())
        << "channel " << ch;
  }
}

class Flux2ReferenceIds : public testing::TestWithParam<SubtreeCase> {};

TEST_P(Flux2ReferenceIds, AsDiffusersBuildsThem) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, test::kMultirefSubtree);
  std::vector<PixelSize> sizes;
  for (const auto& hw : c.json.at("reference_hw")) sizes.push_back({hw.at(0).get<int64_t>(), hw.at(1).get<int64_t>()});
  const test::CaseTensors ref(c.file);
  const std::string vae_config = test::multiref_pipeline_dir(c) + "/vae/config.json";
  const int64_t vae_scale_factor =
      flux2::parse_flux2_vae_config(io::ConfigReader::from_file(vae_config, vae_config)).scale_factor();
  test::expect_identical(c.name + " image_latent_ids", reference_ids_of(sizes, vae_scale_factor).unsqueeze(0),
                         ref.get("image_latent_ids"));
}

INSTANTIATE_TEST_SUITE_P(Cases, Flux2ReferenceIds, testing::ValuesIn(test::multiref_cases("pipeline")),
                         test::image_case_name);

}  // namespace
}  // namespace fluxmpi::pipeline
