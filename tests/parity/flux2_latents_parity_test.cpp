// FLUX.2 latent geometry, noise and ids against every flux2/ pipeline case: the noise drawn from the
// case's seed(s) (one generator for the batch, or a list: one generator per image, as the manifest
// `call` says), latents_initial, latent_ids, text_ids, and the unpacking by ids and unpatchifying
// of the final latents — all bit for bit (the same torch CPU generator and the same copies).

#include <gtest/gtest.h>

#include <filesystem>

#include "io/json_config.h"
#include "models/flux2/latents.h"
#include "models/flux2/vae.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::flux2 {
namespace {

namespace fs = std::filesystem;

class Flux2Latents : public testing::TestWithParam<test::SubtreeCase> {
 protected:
  void SetUp() override {
    const test::SubtreeCase& c = GetParam();
    if (c.name.empty()) return;
    const VaeConfig vae = parse_flux2_vae_config(
        io::ConfigReader::from_file((fs::path(c.model_dir) / "vae" / "config.json").string(), "vae/config.json"));
    const io::ConfigReader transformer =
        io::ConfigReader::from_file((fs::path(c.model_dir) / "transformer" / "config.json").string(), "transformer");
    const int64_t in_channels = transformer.positive("in_channels", 0);
    ASSERT_EQ(in_channels, vae.patch_channels()) << c.name << ": transformer in_channels vs 4 * VAE latent_channels";
    const auto& call = c.json.at("call");
    geometry_ = latent_geometry(call.at("height").get<int64_t>(), call.at("width").get<int64_t>(), vae.scale_factor(),
                                vae.decoder.latent_channels);
  }
  LatentGeometry geometry_;
};

TEST_P(Flux2Latents, GeometryMatchesManifest) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  const auto& hw = c.json.at("latent_hw");
  const auto& out = c.json.at("output_hw");
  EXPECT_EQ(geometry_.latent_height, hw.at(0).get<int64_t>()) << c.name;
  EXPECT_EQ(geometry_.latent_width, hw.at(1).get<int64_t>()) << c.name;
  EXPECT_EQ(geometry_.height, out.at(0).get<int64_t>()) << c.name;
  EXPECT_EQ(geometry_.width, out.at(1).get<int64_t>()) << c.name;
  EXPECT_EQ(geometry_.tokens(), c.json.at("image_seq_len").get<int64_t>()) << c.name;
}

TEST_P(Flux2Latents, NoiseFromTheSeedsAndPacking) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const auto& seed = c.json.at("call").at("seed");
  const int64_t n = c.json.at("num_images").get<int64_t>();
  // The python field says which call diffusers made: a list of generators or one generator.
  const bool generator_list = seed.is_array();
  ASSERT_EQ(generator_list, c.json.at("python").get<std::string>().find("for s in") != std::string::npos) << c.name;
  at::Tensor noise = generator_list ? initial_noise(seed.get<std::vector<int64_t>>(), geometry_, at::kFloat)
                                    : initial_noise(seed.get<int64_t>(), n, geometry_, at::kFloat);
  test::expect_identical(c.name + " noise", noise, ref.get("noise"));
  test::expect_identical(c.name + " latents_initial (from our noise)", pack_latents(noise), ref.get("latents_initial"));
  test::expect_identical(c.name + " latents_initial (from the reference noise)", pack_latents(ref.get("noise")),
                         ref.get("latents_initial"));
}

TEST_P(Flux2Latents, PositionIds) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const at::Tensor latent = ref.get("latent_ids");  // [n, L, 4]
  const at::Tensor text = ref.get("text_ids");      // [n, S, 4]
  ASSERT_EQ(latent.dim(), 3);
  ASSERT_EQ(text.dim(), 3);
  const at::Tensor ours_latent = latent_ids(geometry_);
  const at::Tensor ours_text = text_ids(text.size(1));
  for (int64_t i = 0; i < latent.size(0); ++i)
    test::expect_identical(c.name + " latent_ids[" + std::to_string(i) + "]", ours_latent, latent[i]);
  for (int64_t i = 0; i < text.size(0); ++i)
    test::expect_identical(c.name + " text_ids[" + std::to_string(i) + "]", ours_text, text[i]);
  if (ref.has("negative_text_ids")) {
    const at::Tensor neg = ref.get("negative_text_ids");
    for (int64_t i = 0; i < neg.size(0); ++i)
      test::expect_identical(c.name + " negative_text_ids[" + std::to_string(i) + "]", text_ids(neg.size(1)), neg[i]);
  }
}

TEST_P(Flux2Latents, UnpackByIdsAndUnpatchify) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const at::Tensor final_latents = ref.get("latents_final");
  test::expect_identical(c.name + " latents_unpacked (reference ids)",
                         unpack_latents_with_ids(final_latents, ref.get("latent_ids")), ref.get("latents_unpacked"));
  test::expect_identical(c.name + " latents_unpacked (our ids [L, 4])",
                         unpack_latents_with_ids(final_latents, latent_ids(geometry_)), ref.get("latents_unpacked"));
  test::expect_identical(c.name + " vae_input = unpatchify(latents_denormalized)",
                         unpatchify_latents(ref.get("latents_denormalized")), ref.get("vae_input"));
  // Unpacking undoes the packing.
  test::expect_identical(c.name + " unpack(pack(noise))",
                         unpack_latents_with_ids(pack_latents(ref.get("noise")), latent_ids(geometry_)),
                         ref.get("noise"));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2Latents,
                         testing::ValuesIn(test::flux2_cases([](const std::string& k) { return k == "pipeline"; })),
                         test::image_case_name);

}  // namespace
}  // namespace fluxmpi::flux2
