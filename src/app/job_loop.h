#pragma once
/// Phases 3 and 4 of a job (app/runner.h), on every rank once every slice is loaded: the
/// pipelines denoise, each leader decodes its images, world rank 0 writes the checkpoint and the
/// PNGs. With one pipeline (no --stages) this is the job as it always ran: rank 0 takes every
/// group in order, all in flight at once, then decodes every image. With several, the leaders
/// take groups from the job's shared counter, at most S in flight each (app/leader_job.h for their
/// inputs, app/leader_channel.h for what they send rank 0). A failure on any rank ends the job
/// through MPI_Abort (the caller's).

#include <memory>

#include "app/root_run.h"
#include "pipeline/run_plan.h"
#include "models/flux/stage_model.h"
#include "parallel/mpi_env.h"
#include "parallel/partition.h"
#include "pipeline/denoise.h"
#include "pipeline/fault.h"

namespace fluxmpi::app {

using pipeline::RunPlan;

/// `root`: world rank 0's state (null elsewhere). `part`: this rank's slice of the transformer for
/// its stage of `stages` (the S-rank plan); a leader releases it before it decodes. `control`: a
/// leader's ControlNets (null without), released with the slice. `start`: when
/// the job started, for the summary.
void run_pipelines(const RunPlan& plan, const parallel::MpiEnv& env, RootRun* root, std::shared_ptr<flux::StageModel>& part,
                   std::unique_ptr<pipeline::ResidualSource>& control, const parallel::StagePlan& stages, at::ScalarType dtype, at::Device device, const pipeline::Fault& fault,
                   Clock::time_point start);

}  // namespace fluxmpi::app
