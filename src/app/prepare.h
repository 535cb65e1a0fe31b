#pragma once
/// Rank 0's validation of a run, before any heavy work: options, resumed checkpoint, model
/// configs, the job, the stage plan. One flow for every model family: what differs is the family's
/// (pipeline/family.h, FamilyRoot's validation steps). Everything a user can get wrong is found here and reported
/// as one error; nothing is loaded and nothing is written.

#include <optional>
#include <string>
#include <vector>

#include "app/job.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/format.h"
#include "io/model_dir.h"
#include "models/flux/latents.h"
#include "parallel/partition.h"
#include "pipeline/prepared_run.h"

namespace fluxmpi::app {

using pipeline::ImageProgress;
using pipeline::JobInputs;
using pipeline::PreparedRun;
using pipeline::RunPlan;

/// What rank 0 found: a run to do, or text to print and an exit code (help, version, dry run).
struct Preparation {
  std::optional<PreparedRun> run;
  std::string output;  ///< printed on stdout
  int exit_code = 0;
  std::optional<parallel::StagePlan> dry_run_plan;  ///< --dry-run: the plan `output` prints
};

/// Validates the command line `args` (without the program name) for a job of `world_size`
/// ranks (`hosts`: each rank's host name, for --dry-run; may be empty). With --stages S the plan
/// is made for S ranks, the pipeline every group of S ranks runs. Throws fluxmpi::Error
/// subclasses for everything a user can get wrong.
Preparation prepare_run(const std::vector<std::string>& args, int world_size, const std::vector<std::string>& hosts = {});

/// With --resume: the options left out of the command line are taken from the checkpoint (model,
/// sizes, steps, guidance, sequence length, seed, prompts, dtype, true CFG).
void fill_from_checkpoint(RunConfig& config, const ckpt::CheckpointReader& checkpoint);

/// The checkpoint attributes of one image of the job (vae_tiling set once the plan is known).
ckpt::ImageAttributes attributes_of(const ImageJob& job, const RunConfig& config, const flux::LatentGeometry& geometry);
/// The job of a resumed run whose command line gives no prompts: the checkpoint's prompts, every
/// other option from the command line or (when omitted) from the checkpoint.
std::vector<ImageJob> jobs_from_checkpoint(const ckpt::CheckpointReader& checkpoint, const RunConfig& config);
/// Consecutive images that start at the same step, up to `microbatch` per group.
std::vector<pipeline::WorkGroup> make_groups(const std::vector<ImageProgress>& progress, int64_t steps, int64_t microbatch);

/// What the planner is asked for any model family, added to `request` (whose transformer the family
/// has set: Family::plan_transformer): the run's options, job, geometry and progress. `image_tokens`
/// per image (Kontext: + the reference tokens).
void common_plan_request(const PreparedRun& run, int world_size, int passes, int64_t image_tokens,
                         parallel::PlanRequest& request);
/// Plans the stages (run.stages), sets every image's vae_tiling from the plan, and compares a
/// resumed checkpoint with the attributes once more.
void make_stage_plan(PreparedRun& run, const parallel::PlanRequest& request, const ckpt::CheckpointReader* checkpoint);
/// The run plan's fields every family has; needs run.stages.
RunPlan common_run_plan(const PreparedRun& run, int world_size, int passes);

/// Whether the row of `step` is kept with --checkpoint-every `every` (steps every-1, 2*every-1,
/// ..., and always the last).
bool keep_row(int64_t step, int64_t steps, int64_t every);

}  // namespace fluxmpi::app
