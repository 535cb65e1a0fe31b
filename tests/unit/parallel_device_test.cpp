// Device selection and the thread rule without MPI (the MpiEnv overloads run under mpiexec in
// tests/mpi/env_test.cpp).

#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include "core/error.h"
#include "parallel/device.h"

namespace fluxmpi::parallel {
namespace {

TEST(SelectDevice, CpuIsTheCpu) { EXPECT_EQ(select_device("cpu", 3), at::Device(at::kCPU)); }

TEST(SelectDevice, UnknownFlagIsAUsageError) {
  try {
    select_device("tpu", 0);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--device must be 'cpu' or 'cuda', got 'tpu'");
  }
}

TEST(SelectDevice, CudaFollowsTheLocalRankOrFailsClearly) {
  if (at::hasCUDA() && at::getNumGPUs() > 0) {
    const int gpus = static_cast<int>(at::getNumGPUs());
    for (int local = 0; local < 2 * gpus; ++local)
      EXPECT_EQ(select_device("cuda", local), at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local % gpus)));
    return;
  }
  try {
    select_device("cuda", 0);
    FAIL() << "no error without CUDA";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("--device cuda: ", 0), 0u) << msg;
    if (!at::hasCUDA()) EXPECT_NE(msg.find("libtorch built without CUDA support"), std::string::npos) << msg;
    else EXPECT_NE(msg.find("no GPU is visible"), std::string::npos) << msg;
  }
}

TEST(Threads, DefaultIsCpusPerRankAtLeastOne) {
  EXPECT_EQ(default_threads(32, 4), 8);
  EXPECT_EQ(default_threads(32, 3), 10);
  EXPECT_EQ(default_threads(2, 3), 1);
  EXPECT_EQ(default_threads(1, 1), 1);
  EXPECT_EQ(default_threads(16, 0), 16);
}

TEST(Threads, ApplySetsTheIntraOpCount) {
  apply_threads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(at::get_num_interop_threads(), 1);
  apply_threads(2);  // inter-op threads keep their first value; no error
  EXPECT_EQ(at::get_num_threads(), 2);
  EXPECT_EQ(at::get_num_interop_threads(), 1);
  EXPECT_THROW(apply_threads(0), InternalError);
}

}  // namespace
}  // namespace fluxmpi::parallel
