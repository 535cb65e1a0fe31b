// The allocator behind ReuseLargeBlocks (block_reuse.h): a libtorch CPU allocator that keeps freed
// large blocks. The large blocks are huge-page mappings of their own (models/common/large_alloc.h),
// so a block of a new size is faulted in 2 MiB at a time; the rest is c10::alloc_cpu /
// c10::free_cpu (libtorch's own aligned allocation), from a malloc heap that is held while a scope
// is open (hold_heap below).
#include "models/common/block_reuse.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/version.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "models/common/large_alloc.h"

namespace fluxmpi::nn {

namespace {

// The malloc heap while a scope is open. glibc gives the free top of its heap back to the system
// once it passes the trim threshold, which its dynamic rule sets to twice the largest block it has
// seen freed; an exact transformer step frees more than that between two blocks, so each step
// faulted its activations in again (24 000 page faults a step at 512², a tenth of the step in
// kernel time: docs/performance.md, "Page faults and the patches' own cost"). Inside a scope the
// heap is not trimmed, so a step reuses the pages of the last; requests of kMinReusedBytes or more
// are mapped (this allocator's blocks; the rest of the process's), near where glibc's dynamic
// threshold settles for the sizes seen here. When the last scope closes, malloc_trim gives the
// held pages back and the trim threshold becomes what glibc's rule gives for that mmap threshold
// (once set, glibc keeps both fixed: its dynamic rule does not resume).
void hold_heap(bool hold) {
#if defined(__GLIBC__)
  static_assert(kMinReusedBytes <= (size_t{32} << 20), "glibc refuses an mmap threshold above 32 MiB");
  if (hold) {
    mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMinReusedBytes));
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  } else {
    malloc_trim(0);
    mallopt(M_TRIM_THRESHOLD, static_cast<int>(2 * kMinReusedBytes));
  }
#else
  (void)hold;
#endif
}

// libtorch 2.3 made Allocator::allocate non-const and added the pure copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define FLUXMPI_ALLOCATE_CONST
#define FLUXMPI_ALLOCATOR_COPY_DATA 1
#else
#define FLUXMPI_ALLOCATE_CONST const
#define FLUXMPI_ALLOCATOR_COPY_DATA 0
#endif

class BlockReuseAllocator final : public at::Allocator {
 public:
  static BlockReuseAllocator& instance() {
    static BlockReuseAllocator* a = new BlockReuseAllocator;  // never destroyed: blocks may outlive main
    return *a;
  }

  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (scopes_++ > 0) return;
    hold_heap(true);
    previous_ = c10::GetCPUAllocator();
    c10::SetCPUAllocator(this, /*priority=*/0);
    installed_ = c10::GetCPUAllocator() == this;  // a higher-priority allocator stays in place
    peak_ = live_;
  }

  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--scopes_ > 0) return;
    if (installed_) c10::SetCPUAllocator(previous_, /*priority=*/0);
    installed_ = false;
    while (!kept_.empty()) release_largest();
    hold_heap(false);
  }

  at::DataPtr allocate(size_t bytes) FLUXMPI_ALLOCATE_CONST override {
    const at::Device cpu(at::DeviceType::CPU);
    if (bytes < kMinReusedBytes) {
      void* data = c10::alloc_cpu(bytes);
      return {data, data, &BlockReuseAllocator::release, cpu};
    }
    void* data = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = kept_.find(bytes);
      if (it != kept_.end()) {
        data = it->second;
        kept_bytes_ -= bytes;
        kept_.erase(it);
      } else {
        // Without reuse the process would now hold live_ + bytes of these blocks: kept blocks are
        // given back until it holds no more than that, or than the most it has had in use since
        // the scope opened.
        peak_ = std::max(peak_, live_ + bytes);
        while (!kept_.empty() && live_ + bytes + kept_bytes_ > peak_) release_largest();
        data = map_large(bytes);
        if (data == nullptr) data = c10::alloc_cpu(bytes);
        else mapped_.insert(data);
      }
      live_ += bytes;
      sizes_[data] = bytes;
    }
    return {data, data, &BlockReuseAllocator::release, cpu};
  }

  // oneDNN's buffers in libtorch come through raw_allocate / raw_deallocate, which need one deleter.
  at::DeleterFnPtr raw_deleter() const override { return &BlockReuseAllocator::release; }

#if FLUXMPI_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  static void release(void* data) { instance().give_back(data); }

  // Small blocks, and blocks that another allocator made (a raw_deallocate after the scope changed),
  // are not in sizes_: they go straight back to the system.
  void give_back(void* data) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = sizes_.find(data);
      if (it != sizes_.end()) {
        const size_t bytes = it->second;
        sizes_.erase(it);
        live_ -= bytes;
        if (scopes_ > 0) {
          kept_.emplace(bytes, data);
          kept_bytes_ += bytes;
          return;
        }
        free_block(data, bytes);
        return;
      }
    }
    c10::free_cpu(data);
  }

  // With mutex_ held.
  void free_block(void* data, size_t bytes) const {
    if (mapped_.erase(data) > 0) unmap_large(data, bytes);
    else c10::free_cpu(data);
  }

  // With mutex_ held.
  void release_largest() const {
    const auto last = std::prev(kept_.end());
    free_block(last->second, last->first);
    kept_bytes_ -= last->first;
    kept_.erase(last);
  }

  mutable std::mutex mutex_;
  mutable std::multimap<size_t, void*> kept_;        // freed blocks by size
  mutable std::unordered_map<void*, size_t> sizes_;  // blocks of kMinReusedBytes or more in use
  mutable std::unordered_set<void*> mapped_;         // those of them (in use or kept) from map_large
  mutable size_t live_ = 0, kept_bytes_ = 0;         // bytes in sizes_, in kept_
  mutable size_t peak_ = 0;                          // the most live_ since the scope opened
  int scopes_ = 0;
  bool installed_ = false;
  at::Allocator* previous_ = nullptr;
};

}  // namespace

ReuseLargeBlocks::ReuseLargeBlocks() { BlockReuseAllocator::instance().open(); }

ReuseLargeBlocks::~ReuseLargeBlocks() { BlockReuseAllocator::instance().close(); }

}  // namespace fluxmpi::nn
