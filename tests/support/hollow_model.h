#pragma once
// Hollow FluxPipeline folders at real size, for tests of what is decided from the headers alone
// (--dry-run, plans, budgets, validation): the published configs of FLUX.1-dev or FLUX.1-schnell
// (../shared/assets/configs), the real tokenizers (../shared/assets/tokenizers), and weight files
// in the diffusers layout whose headers hold the real names, dtypes (bf16, as published) and
// shapes while the data is a file hole: ~48 GB of tensors take a few MB of disk. Nothing may read
// past the headers (a hole reads as zeros).

#include <cstdint>
#include <map>
#include <string>

namespace fluxmpi::test {

/// Tensors and elements of one component as written.
struct HollowComponent {
  int64_t tensors = 0;
  int64_t elements = 0;
};

struct HollowModel {
  std::string root;                                ///< the pipeline folder
  std::map<std::string, HollowComponent> written;  ///< by component: transformer, text_encoder, ...
};

/// `variant` is "FLUX.1-dev" or "FLUX.1-schnell" (a folder of assets_root()/configs). Writes the
/// pipeline folder `dir` (created; must not exist). Tensor names and shapes come from fluxmpi's
/// modules built from the configs (their parameter names are the diffusers keys); the
/// transformer of FLUX.1-dev is sharded as its published index says, every other multi-file
/// component (schnell's transformer, text_encoder_2) in the published number of shards, with an
/// index. The VAE file holds the decoder (the encoder's keys are skipped by every reader).
HollowModel write_hollow_model(const std::string& variant, const std::string& dir);

}  // namespace fluxmpi::test
