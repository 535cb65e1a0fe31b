#pragma once
/// What a pipeline leader needs to run the images it takes: the scheduler's inputs and every work
/// group's inputs (latents, text embeddings, image conditioning). World rank 0 makes it — it
/// encoded the prompts and holds the checkpoint, whose stored embeddings and latents a resumed job
/// continues from — and, with several pipelines (`--stages`), broadcasts it to the other leaders
/// before the loop. So every leader holds what rank 0 holds; none encodes or reads HDF5.

#include <ATen/ATen.h>

#include <vector>

#include "app/root_run.h"
#include "pipeline/run_plan.h"
#include "ckpt/checkpoint_writer.h"
#include "parallel/communicator.h"
#include "pipeline/denoise.h"
#include "pipeline/image_conditioning.h"

namespace fluxmpi::app {

using pipeline::RunPlan;

struct LeaderJob {
  /// The schedule, guidance and true-CFG scale, and one GroupInputs per work group of the plan;
  /// its hand-out fields and observer are the caller's.
  pipeline::RootState state;
  /// Inpainting: per work group, what the blend after each step needs ([m, L, 4C] each).
  std::vector<pipeline::Conditioning> blends;
  bool inpaint = false;
  /// Per image of the job: the steps of the full schedule its strength skips (0 without one).
  std::vector<int64_t> t_start;
  /// World rank 0 only: per image, the latents an image with only decoding left resumes with.
  std::vector<at::Tensor> decode_only;

  /// Installs the inpaint blend as state.after_step (it refers to this object: call it where the
  /// job stays).
  void install_blend();
};

/// World rank 0: writes each fresh image's text embeddings, schedule, initial latents (and input
/// conditioning) to the checkpoint, marks it denoising, and gathers every group's inputs on
/// `device` (resumed images from the checkpoint). Frees root's per-image embeddings.
LeaderJob make_leader_job(RootRun& root, const RunPlan& plan, ckpt::CheckpointWriter* writer, at::Device device);

/// Collective over the leaders (world rank 0 first): rank 0's job on every leader, on `device`
/// in its dtype. A no-op with one leader.
void share_leader_job(LeaderJob& job, const parallel::Communicator& leaders, at::Device device);

}  // namespace fluxmpi::app
