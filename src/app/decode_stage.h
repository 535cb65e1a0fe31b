#pragma once
/// Stage 3 on a pipeline leader (world rank 0 with one pipeline): the VAE decodes the leader's
/// images after its denoising loop, once its transformer slice is freed (stage-wise memory: the
/// decoder and the slice are never resident together), a microbatch of images per decoder call
/// (one at a time with --vae-slicing, in tiles with --vae-tiling or when the plan switched tiling
/// on). With tiling over several ranks (RunPlan::decode_ranks) the tiles of each pass spread over
/// the leader's own pipeline (pipeline/tile_decode.h); its helpers run app/decode_helper.h.

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "pipeline/run_plan.h"
#include "io/model_dir.h"
#include "io/png.h"
#include "parallel/communicator.h"

namespace fluxmpi::app {

using pipeline::RunPlan;

/// Decodes `images` (job indices, in the order given) from `latents_of(i)` ([1, L, 4C] packed),
/// `plan.microbatch` at a time, and hands each picture to `done`; `between` runs after each batch
/// (rank 0 serves the other leaders there). `pipeline`: the leader's pipeline (its rank 0), whose
/// decode ranks take tiles; they are told the decode is over also when `images` is empty. Returns
/// false when `images` is empty (no decoder was loaded).
bool decode_images(const io::ModelDir& dir, const RunPlan& plan, const parallel::Communicator& pipeline,
                   at::ScalarType dtype, at::Device device, const std::vector<int64_t>& images,
                   const std::function<at::Tensor(int64_t)>& latents_of,
                   const std::function<void(int64_t, const io::RgbImage&)>& done, const std::function<void()>& between = {});

}  // namespace fluxmpi::app
