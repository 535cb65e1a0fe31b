#pragma once
/// The FLUX.2 schedule as diffusers' Flux2Pipeline / Flux2KleinPipeline build it: the same
/// FlowMatchEulerDiscreteScheduler call as FLUX.1 (sigmas = linspace(1, 1/N, N), the exponential time
/// shift, timesteps = sigma * 1000, a terminal 0), but mu from compute_empirical_mu — a fit in the
/// image token count AND the step count — instead of the config's base/max shift line.

#include <cstdint>

#include "io/configs.h"
#include "sched/flow_match_euler.h"

namespace fluxmpi::sched {

/// diffusers' compute_empirical_mu (pipelines/flux2/pipeline_flux2.py), in float64: for
/// image_seq_len > 4300 only the 200-step line a2 * L + b2; otherwise linear in num_steps between the
/// 10-step and the 200-step lines of L.
double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps);

/// The schedule of `num_steps` steps for `image_seq_len` packed image tokens (the Euler step is
/// sched::euler_step, as for FLUX.1).
Schedule flux2_schedule(const io::SchedulerConfig& config, int64_t num_steps, int64_t image_seq_len);

}  // namespace fluxmpi::sched
