// FlowMatchEulerDiscreteScheduler parity: every entry of the manifest's scheduler_cases file, the
// timesteps/sigmas of every pipeline case, and the Euler update of every pipeline step. The
// schedule is computed in the same float32 operations as diffusers, so timesteps and sigmas are
// compared bit for bit; mu (float64) to 1e-12; Euler steps at kTolFp32.

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "io/json_config.h"
#include "io/model_dir.h"
#include "sched/flow_match_euler.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::sched {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_hex_le(const std::string& hex) {
  uint32_t u = 0;
  for (int i = 3; i >= 0; --i) u = (u << 8) | static_cast<uint32_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(SchedulerCases, EveryEntryBitExact) {
  FLUXMPI_REQUIRE_FIXTURES();
  const auto& m = test::manifest();
  std::ifstream in(test::fixture_root() + "/" + m["scheduler_cases"]["file"].get<std::string>());
  ASSERT_TRUE(in) << "scheduler cases file listed in the manifest is missing";
  nlohmann::json cases = nlohmann::json::parse(in);
  int64_t checked = 0;
  for (const auto& c : cases["cases"]) {
    const std::string name = c["config"].get<std::string>();
    io::SchedulerConfig cfg =
        io::parse_scheduler_config(io::ConfigReader::from_text(cases["configs"][name].dump(), "scheduler case " + name));
    const int64_t steps = c["num_inference_steps"].get<int64_t>(), L = c["image_seq_len"].get<int64_t>();
    Schedule s = flux_schedule(cfg, steps, L);
    const std::string where = name + " N=" + std::to_string(steps) + " L=" + std::to_string(L);
    EXPECT_NEAR(s.mu, c["mu"].get<double>(), 1e-12) << where;
    ASSERT_EQ(s.timesteps.size(), c["timesteps_f32_hex"].size()) << where;
    ASSERT_EQ(s.sigmas.size(), c["sigmas_f32_hex"].size()) << where;
    for (size_t i = 0; i < s.timesteps.size(); ++i) {
      float want = from_hex_le(c["timesteps_f32_hex"][i].get<std::string>());
      EXPECT_EQ(bits(s.timesteps[i]), bits(want)) << where << " timesteps[" << i << "] = " << s.timesteps[i] << ", want " << want;
    }
    for (size_t i = 0; i < s.sigmas.size(); ++i) {
      float want = from_hex_le(c["sigmas_f32_hex"][i].get<std::string>());
      EXPECT_EQ(bits(s.sigmas[i]), bits(want)) << where << " sigmas[" << i << "] = " << s.sigmas[i] << ", want " << want;
    }
    ++checked;
  }
  EXPECT_EQ(checked, m["scheduler_cases"]["count"].get<int64_t>());
}

class PipelineSchedule : public testing::TestWithParam<test::CaseRef> {};

TEST_P(PipelineSchedule, TimestepsSigmasAndEulerSteps) {
  const test::CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  test::CaseTensors ref(c.file);
  io::ModelDir dir(c.model_dir);
  at::Tensor steps = ref.get("latents_steps");  // [N, n, L, 64]
  at::Tensor v = ref.get("noise_pred");
  const int64_t N = steps.size(0), L = steps.size(2);
  Schedule s = flux_schedule(dir.scheduler_config(), N, L);
  const std::string where = test::case_label(c) + ": ";
  EXPECT_NEAR(s.mu, ref.get("mu").item<double>(), 1e-12) << where << "mu";
  EXPECT_TRUE(test::identical(where + "timesteps", at::tensor(s.timesteps), ref.get("timesteps")));
  EXPECT_TRUE(test::identical(where + "sigmas", at::tensor(s.sigmas), ref.get("sigmas")));
  for (int64_t k = 0; k < N; ++k) {
    at::Tensor x = k == 0 ? ref.get("latents_initial") : steps[k - 1];
    at::Tensor next = euler_step(x, v[k], s.sigmas[k], s.sigmas[k + 1]);
    EXPECT_TRUE(test::close_to(where + "latents_steps[" + std::to_string(k) + "]", next, steps[k], test::kTolFp32));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PipelineSchedule, testing::ValuesIn(test::cases_of_kind("pipeline")),
                         test::case_test_name);

}  // namespace
}  // namespace fluxmpi::sched
