// The MPI environment under mpiexec (and as a singleton without it): the runtime baseline of
// the memory model, ranks and nodes, broadcasts, agree(), device selection and the thread rule.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <unistd.h>

#include <cstdio>

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
