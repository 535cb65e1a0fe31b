// parse_flux2_vae_config without fixtures: AutoencoderKLFlux2's own defaults for absent keys (they
// differ from AutoencoderKL's), and one-line ConfigErrors naming the key for what FLUX.2 cannot run.

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "models/flux2/vae.h"

namespace fluxmpi::flux2 {
namespace {

VaeConfig parse(const std::string& json) { return parse_flux2_vae_config(io::ConfigReader::from_text(json, "vae/config.json")); }

void expect_config_error(const std::string& json, const std::string& key) {
  try {
    parse(json);
    ADD_FAILURE() << "no ConfigError for " << json;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("vae/config.json"), std::string::npos) << what;
    EXPECT_NE(what.find("'" + key + "'"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// The defaults of diffusers AutoencoderKLFlux2.__init__.
TEST(Flux2VaeConfig, AbsentKeysTakeAutoencoderKLFlux2Defaults) {
  const VaeConfig c = parse(R"({"_class_name": "AutoencoderKLFlux2"})");
  EXPECT_EQ(c.decoder.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(c.decoder.layers_per_block, 2);
  EXPECT_EQ(c.decoder.latent_channels, 32);
  EXPECT_EQ(c.decoder.norm_num_groups, 32);
  EXPECT_EQ(c.decoder.sample_size, 1024);
  EXPECT_TRUE(c.decoder.use_post_quant_conv);
  EXPECT_TRUE(c.decoder.mid_block_add_attention);
  EXPECT_EQ(c.batch_norm_eps, 1e-4);
  EXPECT_EQ(c.patch_channels(), 128);
  EXPECT_EQ(c.scale_factor(), 8);
}

TEST(Flux2VaeConfig, GivenKeysAreRead) {
  const VaeConfig c = parse(R"({"_class_name": "AutoencoderKLFlux2", "latent_channels": 8, "block_out_channels": [16, 16],
                                "norm_num_groups": 8, "batch_norm_eps": 0.001, "patch_size": [2, 2],
                                "use_post_quant_conv": false, "decoder_block_out_channels": null})");
  EXPECT_EQ(c.decoder.latent_channels, 8);
  EXPECT_EQ(c.patch_channels(), 32);
  EXPECT_EQ(c.scale_factor(), 2);
  EXPECT_EQ(c.batch_norm_eps, 0.001);
  EXPECT_FALSE(c.decoder.use_post_quant_conv);
}

TEST(Flux2VaeConfig, RefusesWhatFlux2CannotRun) {
  expect_config_error(R"({"_class_name": "AutoencoderKL"})", "_class_name");
  expect_config_error(R"({"latent_channels": 32})", "_class_name");
  expect_config_error(R"({"_class_name": "AutoencoderKLFlux2", "patch_size": [1, 1]})", "patch_size");
  expect_config_error(R"({"_class_name": "AutoencoderKLFlux2", "batch_norm_eps": -1})", "batch_norm_eps");
  expect_config_error(R"({"_class_name": "AutoencoderKLFlux2", "decoder_block_out_channels": [64, 64, 64, 64]})",
                      "decoder_block_out_channels");
}

}  // namespace
}  // namespace fluxmpi::flux2
