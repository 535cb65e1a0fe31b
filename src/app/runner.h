#pragma once
/// The `fluxmpi` command on one rank, from the command line to the PNGs (DESIGN.md §2-§6):
///   1. rank 0 validates everything (prepare_run) and sends the plan to every rank;
///   2. rank 0 encodes the prompts and frees the text encoders, every rank loads its transformer
///      slice; the ranks then agree on one exit code, so a bad shard on any rank ends every rank
///      with the same code and its message;
///   3. the denoising loop (pipeline/denoise.h; with --stages one per pipeline, app/job_loop.h),
///      rank 0 writing the checkpoint rows; a failure on any rank from here on ends the job
///      through MPI_Abort;
///   4. rank 0 (each pipeline leader) loads the VAE and decodes its images; rank 0 writes the PNGs.
///      Tiled on several ranks, the other decode ranks of the leader's pipeline free their slice
///      and decode tiles for it (app/decode_helper.h).

#include <string>
#include <vector>

#include "parallel/mpi_env.h"

namespace fluxmpi::app {

/// Runs the command `args` (without the program name). Returns the exit code, the same on every
/// rank; errors are reported here (main only maps what escapes, which are bugs).
int run_fluxmpi(const std::vector<std::string>& args, parallel::MpiEnv& env);

}  // namespace fluxmpi::app
