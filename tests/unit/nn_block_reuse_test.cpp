// ReuseLargeBlocks (models/common/block_reuse.h): large CPU tensors freed inside the scope are handed
// out again, the process never keeps more than it had in use, and the scope leaves libtorch's
// allocator as it found it.

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

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
