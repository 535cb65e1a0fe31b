#include "sched/flow_match_euler.h"

#include <cmath>

#include "core/error.h"

namespace fluxmpi::sched {

double calculate_shift(int64_t image_seq_len, const io::SchedulerConfig& c) {
  const double m = (c.max_shift - c.base_shift) / static_cast<double>(c.max_image_seq_len - c.base_image_seq_len);
  const double b = c.base_shift - m * static_cast<double>(c.base_image_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

namespace {

// numpy.linspace(start, stop, n) in float64: start + i * step, the last value exactly `stop`.
std::vector<double> linspace(double start, double stop, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  if (n == 1) {
    out[0] = start;
    return out;
  }
  const double step = (stop - start) / static_cast<double>(n - 1);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(i) * step + start;
  out[n - 1] = stop;
  return out;
}

}  // namespace

Schedule flux_schedule(const io::SchedulerConfig& c, int64_t num_steps, int64_t image_seq_len) {
  return schedule_with_mu(c, num_steps, calculate_shift(image_seq_len, c));
}

Schedule schedule_with_mu(const io::SchedulerConfig& c, int64_t num_steps, double mu) {
  FLUX_CHECK(num_steps >= 1, "num_steps must be positive");
  Schedule s;
  s.mu = mu;
  std::vector<double> in = linspace(1.0, 1.0 / static_cast<double>(num_steps), num_steps);
  // numpy arithmetic between float32 arrays and Python scalars stays in float32: every scalar is
  // rounded to float32 first, and every operation is a float32 operation.
  std::vector<float> sigmas(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const float t = static_cast<float>(in[i]);
    float shifted;
    if (c.use_dynamic_shifting) {
      const float base = c.time_shift_type == "exponential" ? static_cast<float>(std::exp(s.mu)) : static_cast<float>(s.mu);
      const float odds = 1.0f / t - 1.0f;  // (1/t - 1) ** 1.0
      shifted = base / (base + odds);
    } else {
      // shift * t / (1 + (shift - 1) * t): `shift - 1` is a Python float subtraction (float64).
      const float shift = static_cast<float>(c.shift);
      const float shift_minus_one = static_cast<float>(c.shift - 1.0);
      shifted = shift * t / (1.0f + shift_minus_one * t);
    }
    sigmas[i] = shifted;
  }
  if (c.shift_terminal) {
    // Stretch so that the last sigma lands on shift_terminal.
    const double scale = static_cast<double>(1.0f - sigmas.back()) / (1.0 - *c.shift_terminal);
    const float scale32 = static_cast<float>(scale);
    for (float& v : sigmas) v = 1.0f - (1.0f - v) / scale32;
  }
  const float train = static_cast<float>(c.num_train_timesteps);
  for (float v : sigmas) s.timesteps.push_back(v * train);
  s.sigmas = sigmas;
  s.sigmas.push_back(0.0f);
  return s;
}

at::Tensor euler_step(const at::Tensor& sample, const at::Tensor& v, float sigma, float sigma_next) {
  FLUX_CHECK(sample.sizes() == v.sizes(), "euler_step: sample and v shapes differ");
  // (sigma_next - sigma) is a float32 0-dim tensor in diffusers: it does not promote v.
  at::Tensor dt = at::scalar_tensor(sigma_next - sigma, at::TensorOptions().dtype(at::kFloat).device(v.device()));
  at::Tensor prev = sample.to(at::kFloat) + dt * v;
  return prev.to(v.scalar_type());
}

}  // namespace fluxmpi::sched
