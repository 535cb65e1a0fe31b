#pragma once
/// `fluxmpi --dry-run --predict PROFILE.json`: the schedule model's prediction for the job a dry run
/// describes (tools/sim/README.md). fluxmpi writes the job as tools/sim/fluxsim.py's options — its
/// ranks and pipelines (--stages), one pipeline's slices, sizes, steps, patches, microbatch, images, distinct prompts, passes,
/// checkpoint and VAE decode — runs the simulator with python3 and prints its report: throughput
/// (images/hour), one image's latency and each rank's idle share.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "app/prepare.h"
#include "parallel/partition.h"

namespace fluxmpi::app {

/// The job as the simulator takes it.
struct PredictJob {
  std::string profile;
  int ranks = 1;                                ///< the job's ranks P
  int stages = 1;                               ///< ranks per pipeline S (--stages; S = P: one pipeline)
  std::vector<parallel::BlockRange> partition;  ///< one pipeline's blocks per rank
  int64_t microbatch = 1, patches = 1, warmup_steps = 1;
  int64_t images = 1, prompts = 1, steps = 28;
  int64_t height = 1024, width = 1024, text_tokens = 512;
  bool true_cfg = false;
  bool checkpoint = false;
  int64_t checkpoint_every = 1;
  bool vae_tiling = false, vae_slicing = false;
  int64_t decode_ranks = 1;
  int64_t vae_tile = 128, vae_scale = 8;  ///< latent cells of a VAE tile, pixels per latent cell
  std::array<int64_t, 4> transformer{};   ///< double blocks, single blocks, heads, head dim
};

/// The dry run's job: `plan` for `images` images of `run` with `passes` transformer passes a step.
/// UsageError for what the model does not cover (FLUX.2, image inputs).
PredictJob predict_job(const PreparedRun& run, const parallel::StagePlan& plan, int64_t images, int passes);

/// fluxsim.py's options for `job` (what follows the script's path).
std::vector<std::string> simulator_args(const PredictJob& job);

/// tools/sim/fluxsim.py next to an installed fluxmpi (share/fluxmpi/sim), else in the source tree.
std::string simulator_path();

/// Runs `python3 <simulator_path()> <simulator_args(job)>`: "prediction (python3 ...):\n" and its
/// report. UsageError naming --predict, in one line, when python3 or the simulator is missing or
/// the simulator refuses the job (a missing or malformed profile, another transformer).
std::string predict(const PredictJob& job);

}  // namespace fluxmpi::app
