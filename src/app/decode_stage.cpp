#include "app/decode_stage.h"

#include <c10/core/InferenceMode.h>

#include <memory>
#include <optional>

#include "app/root_run.h"
#include "core/log.h"
#include "models/vae/vae_decoder.h"
#include "pipeline/family.h"
#include "pipeline/tile_decode.h"

namespace fluxmpi::app {

bool decode_images(const io::ModelDir& dir, const RunPlan& plan, const parallel::Communicator& pipeline,
                   at::ScalarType dtype, at::Device device, const std::vector<int64_t>& images,
                   const std::function<at::Tensor(int64_t)>& latents_of,
                   const std::function<void(int64_t, const io::RgbImage&)>& done, const std::function<void()>& between) {
  const pipeline::Family& family = pipeline::family_named(plan.family);
  std::unique_ptr<pipeline::ImageDecoder> decoder;  // loaded with the first batch
  vae::DecodeOptions options;
  options.tiling = plan.vae_tiling;
  options.slicing = plan.vae_slicing;
  // Tiled: the tiles of each pass spread over the pipeline's decode ranks, blended here.
  std::optional<pipeline::TileDecodeLeader> spread;
  if (plan.decode_ranks.size() > 1) {
    spread.emplace(pipeline, plan.decode_ranks, dtype, device);
    options.tiles = &*spread;
  }
  std::vector<int64_t> batch;
  auto decode_batch = [&]() {
    if (batch.empty()) return;
    {
      c10::InferenceMode guard;
      std::vector<at::Tensor> packed;
      for (int64_t i : batch) packed.push_back(latents_of(i).to(device));
      if (!decoder) decoder = family.decoder(dir, dtype, device);
      const std::vector<io::RgbImage> pictures = decoder->decode(at::cat(packed, 0), plan.geometry, options);
      for (size_t k = 0; k < batch.size(); ++k) done(batch[k], pictures[k]);
    }
    batch.clear();
    if (between) between();
  };
  for (int64_t i : images) {
    batch.push_back(i);
    if (static_cast<int64_t>(batch.size()) == plan.microbatch) decode_batch();
  }
  decode_batch();
  if (spread) {
    spread->finish();  // also without images: the helpers wait for it
    std::string ranks;
    for (int r : plan.decode_ranks) ranks += str_cat(ranks.empty() ? "" : ", ", pipeline.world_rank(r));
    log::debug("decoded ", spread->passes(), " tiled pass(es) over ranks ", ranks, ", ",
               seconds_text(spread->blocked_seconds()), " waiting for the helpers' tiles");
  }
  return !images.empty();
}

}  // namespace fluxmpi::app
