// The MPI environment under mpiexec (and as a singleton without it): the runtime baseline of
// the memory model, ranks and nodes, broadcasts, agree() (and that their waiting ranks do not
// spin), device selection and the thread rule.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>

#include "core/error.h"
#include "core/units.h"
#include "parallel/device.h"
#include "parallel/partition.h"
#include "parallel/runtime_baseline.h"
#include "mpi_test_main.h"

namespace fluxmpi::parallel {
namespace {

const MpiEnv& env() { return test::mpi_env(); }

// First in this file, so that nothing else has grown the process yet: a libtorch + Open MPI
// process that has run one matmul fits the planner's runtime baseline.
TEST(RuntimeBaseline, CoversAFreshProcess) {
  apply_threads(default_threads(env().node_cpus(), env().local_size()));
  at::Tensor a = at::randn({256, 256});
  at::Tensor b = at::mm(a, a);
  ASSERT_EQ(b.size(0), 256);
  const uint64_t rss = current_rss_bytes();
  ASSERT_GT(rss, 0u) << "cannot read VmRSS";
  std::printf("[rank %d] resident after MPI + libtorch start-up: %s (baseline constants: rank 0 %s, later ranks %s)\n",
              env().rank(), format_bytes(rss).c_str(), format_bytes(kRuntimeBaselineBytes).c_str(),
              format_bytes(kWorkerRuntimeBaselineBytes).c_str());
  EXPECT_LE(rss, kRuntimeBaselineBytes) << "kRuntimeBaselineBytes (src/parallel/partition.h) is below a measured "
                                        << format_bytes(rss);
  // What a rank after rank 0 holds before its blocks (no tokenizers or writers loaded yet here).
  EXPECT_LE(rss, kWorkerRuntimeBaselineBytes)
      << "kWorkerRuntimeBaselineBytes (src/parallel/runtime_baseline.h) is below a measured " << format_bytes(rss);
  env().barrier();
}

TEST(MpiEnvironment, RanksAndNode) {
  EXPECT_GE(env().rank(), 0);
  EXPECT_LT(env().rank(), env().size());
  EXPECT_EQ(env().is_root(), env().rank() == 0);
  // The tests run on one node: node ranks are world ranks.
  EXPECT_EQ(env().local_size(), env().size());
  EXPECT_EQ(env().local_rank(), env().rank());
  EXPECT_FALSE(env().node_name().empty());
  EXPECT_EQ(env().broadcast_string(env().node_name()), env().node_name());
  EXPECT_GE(env().affinity_cpus(), 1);
  EXPECT_GE(env().node_cpus(), env().affinity_cpus());
  EXPECT_LE(env().node_cpus(), static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
  env().barrier();
}

TEST(MpiEnvironment, Broadcasts) {
  const bool root = env().rank() == 0;
  static const char kText[] = "prompt: a caf\xc3\xa9 at night\0with a NUL";
  const std::string text(kText, sizeof kText - 1);
  EXPECT_EQ(env().broadcast_string(root ? text : "something else"), text);
  EXPECT_EQ(env().broadcast_string(root ? "" : "x"), "");

  std::vector<uint8_t> bytes(100000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  EXPECT_EQ(env().broadcast_bytes(root ? bytes : std::vector<uint8_t>{1, 2}), bytes);
  EXPECT_TRUE(env().broadcast_bytes(root ? std::vector<uint8_t>{} : bytes).empty());

  const std::vector<int64_t> values = {-1, 0, 42, int64_t{1} << 40, std::numeric_limits<int64_t>::min()};
  EXPECT_EQ(env().broadcast_int64s(root ? values : std::vector<int64_t>{}), values);
}

TEST(MpiEnvironment, AgreeGivesEveryRankTheSameCode) {
  const int r = env().rank(), last = env().size() - 1;
  EXPECT_EQ(env().agree(0), 0);
  // The last rank failed with bad input (3), rank 0 with a usage error (2) unless it is the last
  // one too: everyone exits with 3.
  const int local = r == last ? kExitBadInput : (r == 0 ? kExitUsage : kExitOk);
  EXPECT_EQ(env().agree(local), kExitBadInput);
  EXPECT_EQ(env().agree(r == last ? kExitFailure : kExitOk), kExitFailure);
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Rank 0 arrives 300 ms late at each collective; the ranks waiting for it must sleep, not poll
// (Open MPI's blocking collectives spin a core: wall time ~= CPU time). The bound can only be
// missed by spinning: a quiet wait uses about 1 % of its wall time, and a loaded machine lowers
// the CPU share of a spinning wait, never that of a sleeping one.
TEST(MpiEnvironment, RanksWaitingForRankZeroDoNotSpin) {
  if (env().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const std::vector<std::pair<std::string, std::function<void()>>> collectives = {
      {"agree", [] { env().agree(0); }},
      {"broadcast_string", [] { env().broadcast_string(env().is_root() ? "plan" : ""); }},
      {"broadcast_int64s", [] { env().broadcast_int64s(env().is_root() ? std::vector<int64_t>{7} : std::vector<int64_t>{}); }},
      {"quiet_barrier", [] { env().world().quiet_barrier(); }},
  };
  for (const auto& [name, collective] : collectives) {
    env().barrier();
    if (env().is_root()) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto wall0 = std::chrono::steady_clock::now();
    const double cpu0 = thread_cpu_seconds();
    collective();
    const double cpu = thread_cpu_seconds() - cpu0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    // 20 ms for the collective's own work, should the rank not have waited at all.
    if (!env().is_root())
      EXPECT_LT(cpu, 0.25 * wall + 0.02) << name << ": " << cpu << " s of CPU while waiting " << wall << " s (spinning)";
  }
  EXPECT_TRUE(env().broadcast_int64s(env().is_root() ? std::vector<int64_t>{} : std::vector<int64_t>{1, 2}).empty());
  env().barrier();
}

TEST(DeviceBinding, CudaOnThisBuild) {
  EXPECT_EQ(select_device("cpu", env()), at::Device(at::kCPU));
  if (at::hasCUDA() && at::getNumGPUs() > 0) {
    EXPECT_EQ(select_device("cuda", env()).index(), env().local_rank() % static_cast<int>(at::getNumGPUs()));
    return;
  }
  try {
    select_device("cuda", env());
    FAIL() << "--device cuda accepted without CUDA";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--device cuda: ", 0), 0u) << e.what();
  }
}

TEST(DeviceBinding, ThreadRule) {
  const int expected = std::max(1, env().node_cpus() / env().local_size());
  EXPECT_EQ(resolve_threads(0, env()), expected);
  EXPECT_EQ(resolve_threads(3, env()), 3);
  EXPECT_THROW(resolve_threads(-1, env()), UsageError);
  apply_threads(resolve_threads(0, env()));
  EXPECT_EQ(at::get_num_threads(), expected);
}

}  // namespace
}  // namespace fluxmpi::parallel
