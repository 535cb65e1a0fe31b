// The VAE encode stage's estimate (parallel/encode_memory.h): the parameter count equals the
// encoder module's, for the fixture VAE and for FLUX.1's real VAE config; the activations grow
// with the image area.

#include <gtest/gtest.h>

#include <filesystem>

#include "io/configs.h"
#include "io/json_config.h"
#include "models/vae/vae_encoder.h"
#include "parallel/encode_memory.h"
#include "support/fixtures.h"

namespace fluxmpi::parallel {
namespace {

int64_t module_params(const vae::VaeEncoderConfig& c) {
  vae::VaeEncoder encoder(c);
  int64_t n = 0;
  for (const auto& p : encoder->parameters()) n += p.numel();
  return n;
}

vae::VaeEncoderConfig config_of(const std::string& path) {
  return vae::parse_vae_encoder_config(io::ConfigReader::from_file(path, path));
}

TEST(EncodeMemory, ParameterCountIsTheModules) {
  const std::string real = test::assets_root() + "/configs/FLUX.1-dev/vae/config.json";
  for (const std::string& path : {test::fixture_root() + "/tiny-flux-dev/vae/config.json", real}) {
    if (!std::filesystem::exists(path)) {
      if (test::running_in_ci()) FAIL() << path << " missing";
      GTEST_SKIP() << path << " missing";
    }
    const vae::VaeEncoderConfig c = config_of(path);
    EXPECT_EQ(count_vae_encoder_params(c.vae, c.use_quant_conv), module_params(c)) << path;
  }
}

TEST(EncodeMemory, ActivationsFollowTheArea) {
  io::VaeConfig v;
  v.block_out_channels = {128, 256, 512, 512};
  v.layers_per_block = 2;
  v.latent_channels = 16;
  const EncodeStage small = vae_encode_stage(v, false, 512, 512, 4, 0);
  const EncodeStage large = vae_encode_stage(v, false, 1024, 1024, 4, 0);
  EXPECT_EQ(small.weight_bytes, large.weight_bytes);
  // The top level (128 + 3 channels at full size) dominates: 4x the pixels, about 4x the bytes.
  EXPECT_GT(large.activation_bytes, 3 * small.activation_bytes);
  EXPECT_EQ(large.weight_bytes, static_cast<uint64_t>(count_vae_encoder_params(v, false) * 4));
}

}  // namespace
}  // namespace fluxmpi::parallel
