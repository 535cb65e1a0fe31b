// ReuseLargeBlocks (models/common/block_reuse.h): large CPU tensors freed inside the scope are handed
// out again, the process never keeps more than it had in use, smaller ones reuse malloc's held
// heap, and the scope leaves libtorch's allocator as it found it.

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include "models/common/block_reuse.h"

namespace fluxmpi::nn {
namespace {

const int64_t kLarge = static_cast<int64_t>(kMinReusedBytes / sizeof(float)) + 1024;  // floats

TEST(ReuseLargeBlocks, HandsAFreedBlockToTheNextTensorOfItsSize) {
  ReuseLargeBlocks reuse;
  void* first = nullptr;
  {
    at::Tensor a = at::empty({kLarge});
    first = a.data_ptr();
  }
  at::Tensor b = at::full({kLarge}, 2.0f);
  EXPECT_EQ(b.data_ptr(), first) << "the freed block is reused";
  EXPECT_EQ(b.sum().item<double>(), 2.0 * kLarge) << "and holds what was written into it";
}

TEST(ReuseLargeBlocks, LeavesSmallTensorsAndOtherSizesAlone) {
  ReuseLargeBlocks reuse;
  void* large = nullptr;
  {
    at::Tensor a = at::empty({kLarge});
    large = a.data_ptr();
  }
  at::Tensor small = at::empty({16});
  EXPECT_NE(small.data_ptr(), large) << "small tensors come from malloc, never from a kept block";
  at::Tensor half = at::empty({kLarge / 2 + 4096});
  EXPECT_NE(half.data_ptr(), large) << "only a tensor of exactly a kept block's size gets it";
}

#if defined(__GLIBC__)
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Below kMinReusedBytes a tensor comes from malloc, whose heap the scope holds: tensors freed and
// asked for again, size for size (as each denoising step asks for the last one's activations),
// come from pages already faulted in once the heap has settled (glibc places the aligned blocks
// differently for the first rounds). By glibc's own rule the free top of the heap, more than twice
// the largest block seen freed, would go back to the system after every round and be faulted in
// again at the next: 6144 faults a round.
TEST(ReuseLargeBlocks, SmallerTensorsReuseTheHeldHeapWithoutPageFaults) {
  ReuseLargeBlocks reuse;
  const int64_t floats = static_cast<int64_t>(kMinReusedBytes / sizeof(float)) / 2;  // 8 MiB: 2048 pages
  const auto round = [&] {
    at::Tensor a = at::full({floats}, 1.0f), b = at::full({floats}, 2.0f);
    return (a + b).sum().item<double>();
  };
  for (int i = 0; i < 16; ++i) round();
  const long before = minor_faults();
  EXPECT_EQ(round(), 3.0 * static_cast<double>(floats));
  EXPECT_LT(minor_faults() - before, 256) << "three 8 MiB tensors (6144 pages) faulted in again";
}
#endif

TEST(ReuseLargeBlocks, RestoresTheAllocatorWhenTheLastScopeCloses) {
  at::Allocator* before = c10::GetCPUAllocator();
  at::Tensor survivor;
  {
    ReuseLargeBlocks outer;
    EXPECT_NE(c10::GetCPUAllocator(), before);
    {
      ReuseLargeBlocks inner;
      survivor = at::ones({kLarge});
    }
    EXPECT_NE(c10::GetCPUAllocator(), before) << "an inner scope keeps the outer one's allocator";
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  EXPECT_EQ(survivor.sum().item<double>(), static_cast<double>(kLarge)) << "a tensor may outlive the scope";
  survivor = at::Tensor();  // freed normally after the scope
  at::Tensor after = at::zeros({kLarge});
  EXPECT_EQ(after.sum().item<double>(), 0.0);
}

}  // namespace
}  // namespace fluxmpi::nn
