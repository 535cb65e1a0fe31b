// Semantics of diffusers compute_empirical_mu and the set_timesteps(sigmas, mu) call of Flux2Pipeline.
#include "sched/flux2_schedule.h"

#include "core/error.h"

namespace fluxmpi::sched {

double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps) {
  FLUX_CHECK(image_seq_len >= 1 && num_steps >= 1, "image_seq_len ", image_seq_len, ", num_steps ", num_steps);
  // The fit's constants as diffusers writes them (Python floats, i.e. float64); the operations are
  // kept in diffusers' order so that mu agrees to the last bit.
  constexpr double a1 = 8.73809524e-05, b1 = 1.89833333;
  constexpr double a2 = 0.00016927, b2 = 0.45666666;
  const double L = static_cast<double>(image_seq_len);
  const double m_200 = a2 * L + b2;
  if (image_seq_len > 4300) return m_200;
  const double m_10 = a1 * L + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - 200.0 * a;
  return a * static_cast<double>(num_steps) + b;
}

Schedule flux2_schedule(const io::SchedulerConfig& config, int64_t num_steps, int64_t image_seq_len) {
  return schedule_with_mu(config, num_steps, compute_empirical_mu(image_seq_len, num_steps));
}

}  // namespace fluxmpi::sched
