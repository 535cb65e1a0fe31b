#pragma once
/// Flow-matching Euler scheduler as FluxPipeline drives diffusers'
/// FlowMatchEulerDiscreteScheduler: sigmas = linspace(1, 1/N, N) (float64) cast to float32,
/// shifted (dynamically by mu from the image token count, or statically), timesteps = sigma * 1000,
/// a terminal 0 appended; the Euler step x <- x + (sigma_next - sigma) * v.

#include <ATen/ATen.h>

#include <vector>

#include "io/configs.h"

namespace fluxmpi::sched {

struct Schedule {
  std::vector<float> timesteps;  ///< N values, sigma * num_train_timesteps
  std::vector<float> sigmas;     ///< N + 1 values, the last one 0
  double mu = 0;                 ///< the dynamic shift used (computed even when unused, as FluxPipeline does)

  int64_t num_steps() const { return static_cast<int64_t>(timesteps.size()); }
};

/// diffusers' calculate_shift: mu linear in the image token count (float64).
double calculate_shift(int64_t image_seq_len, const io::SchedulerConfig& config);

/// The schedule of `num_steps` steps for an image of `image_seq_len` packed tokens.
Schedule flux_schedule(const io::SchedulerConfig& config, int64_t num_steps, int64_t image_seq_len);

/// The schedule of set_timesteps(sigmas=linspace(1, 1/N, N), mu=mu): what flux_schedule computes once
/// it has its mu; the pipelines that derive mu otherwise (FLUX.2, sched/flux2_schedule.h) pass it here.
Schedule schedule_with_mu(const io::SchedulerConfig& config, int64_t num_steps, double mu);

/// One Euler step: sample + (sigma_next - sigma) * v, computed as the scheduler does (sample upcast
/// to float32, result cast back to v's dtype). sample, v: same shape.
at::Tensor euler_step(const at::Tensor& sample, const at::Tensor& v, float sigma, float sigma_next);

}  // namespace fluxmpi::sched
