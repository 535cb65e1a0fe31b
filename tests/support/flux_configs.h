#pragma once
// Configs of the real FLUX.1 models written out, for tests that plan at real size without files.

#include "io/configs.h"

namespace fluxmpi::test {

/// FLUX.1's VAE (black-forest-labs/FLUX.1-dev vae/config.json): 128-512 channels, 16 latent
/// channels, 1024-px tiles.
inline io::VaeConfig flux1_vae_config() {
  io::VaeConfig c;
  c.block_out_channels = {128, 256, 512, 512};
  c.layers_per_block = 2;
  c.latent_channels = 16;
  c.norm_num_groups = 32;
  c.use_post_quant_conv = false;
  c.mid_block_add_attention = true;
  c.sample_size = 1024;
  return c;
}

}  // namespace fluxmpi::test
