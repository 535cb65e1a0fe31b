#include "app/decode_helper.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "core/log.h"
#include "core/units.h"
#include "io/model_dir.h"
#include "models/flux2/vae.h"
#include "models/vae/vae_decoder.h"
#include "pipeline/tile_decode.h"

namespace fluxmpi::app {

bool helps_decode(const RunPlan& plan, int rank) {
  return plan.decode_ranks.size() > 1 && rank != plan.decode_ranks.front() &&
         std::find(plan.decode_ranks.begin(), plan.decode_ranks.end(), rank) != plan.decode_ranks.end();
}

void help_decode(const RunPlan& plan, const parallel::Communicator& comm, at::ScalarType dtype, at::Device device) {
  const auto t0 = std::chrono::steady_clock::now();
  auto load = [&]() {
    const io::ModelDir dir(plan.sources);
    // FLUX.2's AutoencoderKLFlux2 decodes with the FLUX.1 decoder (post_quant_conv + Decoder); its
    // bn statistics act on the packed latents before the leader cuts tiles.
    std::shared_ptr<vae::VaeDecoder> decoder;
    if (plan.family == "flux2") {
      auto vae = std::make_shared<flux2::Vae>(flux2::load_vae(dir.component_dir("vae"), dtype, device));
      decoder = std::shared_ptr<vae::VaeDecoder>(vae, &vae->decoder());
    } else {
      decoder = std::make_shared<vae::VaeDecoder>(vae::load_vae_decoder(dir, dtype, device));
    }
    pipeline::TileDecoder d;
    d.geometry = vae::tile_geometry((*decoder)->config());
    d.decode = [decoder](const at::Tensor& z) { return (*decoder)->forward(z); };
    return d;
  };
  const int64_t tiles = pipeline::help_tile_decode(comm, plan.decode_ranks, load, device);
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.2f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  log::debug("decoded ", tiles, " VAE tile(s) for rank ", comm.world_rank(plan.decode_ranks.front()), " in ", seconds, "; peak RSS ",
             format_bytes(peak_rss_bytes()));
}

}  // namespace fluxmpi::app
