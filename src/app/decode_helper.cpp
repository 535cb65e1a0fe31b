#include "app/decode_helper.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/log.h"
#include "core/units.h"
#include "io/model_dir.h"
#include "pipeline/family.h"
#include "pipeline/tile_decode.h"

namespace fluxmpi::app {

bool helps_decode(const RunPlan& plan, int rank) {
  return plan.decode_ranks.size() > 1 && rank != plan.decode_ranks.front() &&
         std::find(plan.decode_ranks.begin(), plan.decode_ranks.end(), rank) != plan.decode_ranks.end();
}

void help_decode(const RunPlan& plan, const parallel::Communicator& comm, at::ScalarType dtype, at::Device device) {
  const auto t0 = std::chrono::steady_clock::now();
  // The family's decoder, loaded when the first pass arrives.
  auto load = [&]() { return pipeline::family_named(plan.family).tile_decoder(io::ModelDir(plan.sources), dtype, device); };
  const int64_t tiles = pipeline::help_tile_decode(comm, plan.decode_ranks, load, device);
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.2f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  log::debug("decoded ", tiles, " VAE tile(s) for rank ", comm.world_rank(plan.decode_ranks.front()), " in ", seconds, "; peak RSS ",
             format_bytes(peak_rss_bytes()));
}

}  // namespace fluxmpi::app
