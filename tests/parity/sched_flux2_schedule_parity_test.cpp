// FLUX.2 schedule parity: compute_empirical_mu, timesteps and sigmas of every flux2/ pipeline case
// (mu float64 to 1e-12, the float32 schedule bit for bit: the same float32 operations as numpy), and
// the Euler steps chained from latents_initial with each step's recorded noise_pred
// (kTolPipelineFp32; the per-step update from the recorded input at kTolFp32).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "io/json_config.h"
#include "sched/flux2_schedule.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::sched {
namespace {

// Distance in units in the last place between two finite floats of one sign.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

void expect_bits(const std::string& what, const std::vector<float>& got, const at::Tensor& ref) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), ref.numel()) << what << ": length";
  const at::Tensor r = ref.to(at::kFloat).contiguous();
  int64_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = r.data_ptr<float>()[i];
    const int64_t d = ulps(got[i], want);
    worst = std::max(worst, d);
    EXPECT_EQ(d, 0) << what << "[" << i << "] = " << got[i] << ", diffusers " << want << " (" << d << " ulp)";
  }
  std::printf("[ measured ] %s: max %lld ulp over %zu values\n", what.c_str(), static_cast<long long>(worst), got.size());
}

// compute_empirical_mu beyond the fixtures' small images (both branches, the 4300 edge), against
// the values of diffusers' Python expression (float64, printed with float.hex()).
TEST(Flux2EmpiricalMu, MatchesDiffusersPythonValues) {
  struct Want {
    int64_t L, N;
    double mu;
  };
  const Want table[] = {{256, 4, 0x1.f72f68d4575acp+0},    {1024, 28, 0x1.dbf2ff047ad08p+0},
                        {4096, 50, 0x1.02fd2bb418d33p+1},  {4300, 50, 0x1.05b886b04cbf6p+1},
                        {4301, 50, 0x1.2f484c4a0587bp+0},  {16384, 4, 0x1.9d70314069d28p+1},
                        {16384, 50, 0x1.9d70314069d28p+1}, {1, 1, 0x1.f77a10806b0b1p+0}};
  for (const Want& w : table)
    EXPECT_EQ(compute_empirical_mu(w.L, w.N), w.mu) << "L=" << w.L << " N=" << w.N;
}

class Flux2PipelineSchedule : public testing::TestWithParam<test::SubtreeCase> {};

TEST_P(Flux2PipelineSchedule, MuSigmasTimestepsAndEulerSteps) {
  const test::SubtreeCase& c = GetParam();
  REQUIRE_FLUX2_CASE(c);
  test::CaseTensors ref(c.file);
  const std::string where = c.name + ": ";
  const io::SchedulerConfig config = io::parse_scheduler_config(io::ConfigReader::from_file(
      (std::filesystem::path(c.model_dir) / "scheduler" / "scheduler_config.json").string(), "scheduler_config.json"));
  const at::Tensor initial = ref.get("latents_initial");  // [n, L, C]
  const at::Tensor steps = ref.get("latents_steps");      // [N, n, L, C]
  const at::Tensor v = ref.get("noise_pred");             // [N, n, L, C]
  const int64_t N = c.json.at("call").at("num_inference_steps").get<int64_t>();
  const int64_t L = initial.size(1);
  ASSERT_EQ(L, c.json.at("image_seq_len").get<int64_t>()) << where << "image_seq_len";
  ASSERT_EQ(steps.size(0), N) << where << "latents_steps";

  const Schedule s = flux2_schedule(config, N, L);
  const double mu_ref = ref.get("mu").item<double>();
  EXPECT_NEAR(s.mu, mu_ref, 1e-12) << where << "mu";
  EXPECT_NEAR(s.mu, c.json.at("mu").get<double>(), 1e-12) << where << "manifest mu";
  std::printf("[ measured ] %smu: |diff| %.3e (%.17g vs %.17g)\n", where.c_str(), std::fabs(s.mu - mu_ref), s.mu, mu_ref);
  expect_bits(where + "timesteps", s.timesteps, ref.get("timesteps"));
  expect_bits(where + "sigmas", s.sigmas, ref.get("sigmas"));

  at::Tensor x = initial;
  for (int64_t k = 0; k < N; ++k) {
    const std::string step = where + "latents_steps[" + std::to_string(k) + "]";
    const at::Tensor from_recorded = euler_step(k == 0 ? initial : steps[k - 1], v[k], s.sigmas[k], s.sigmas[k + 1]);
    test::expect_close(step + " (one step from the recorded input)", from_recorded, steps[k], test::kTolFp32);
    x = euler_step(x, v[k], s.sigmas[k], s.sigmas[k + 1]);
    test::expect_close(step + " (chained from latents_initial)", x, steps[k], test::kTolPipelineFp32);
  }
  test::expect_close(where + "latents_final (chained)", x, ref.get("latents_final"), test::kTolPipelineFp32);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2PipelineSchedule,
                         testing::ValuesIn(test::flux2_cases([](const std::string& k) { return k == "pipeline"; })),
                         test::image_case_name);

}  // namespace
}  // namespace fluxmpi::sched
