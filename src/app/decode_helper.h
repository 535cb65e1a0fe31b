#pragma once
/// A decode helper's part of a job (parallel::StagePlan::decode_ranks other than the leader): once
/// its transformer work for the job is done and its slice freed, the rank decodes its share of the
/// VAE tiles of every pass (pipeline/tile_decode.h) with the decoder of the model's family, loaded
/// when the first pass arrives and freed at the end.

#include <ATen/ATen.h>

#include "pipeline/run_plan.h"
#include "parallel/communicator.h"

namespace fluxmpi::app {

using pipeline::RunPlan;

/// Whether `rank` helps the leader decode (a decode rank other than the first).
bool helps_decode(const RunPlan& plan, int rank);

/// The helper's loop on `comm` (the ranks of this pipeline). Throws what loading or decoding throws.
void help_decode(const RunPlan& plan, const parallel::Communicator& comm, at::ScalarType dtype, at::Device device);

}  // namespace fluxmpi::app
