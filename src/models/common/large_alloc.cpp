#include "models/common/large_alloc.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace fluxmpi::nn {
namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20, kPage = 4096;

uintptr_t round_up(uintptr_t n, uintptr_t to) { return (n + to - 1) / to * to; }

// FLUXMPI_HUGE_PAGES=0 turns the mappings off (A/B benchmarks in one build: docs/performance.md).
bool mappings_on() {
  static const bool on = [] {
    const char* v = std::getenv("FLUXMPI_HUGE_PAGES");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace

void* map_large(size_t bytes) {
  if (!mappings_on() || bytes == 0) return nullptr;
  // Over-map by one huge page, then trim both ends so that the mapping starts on a 2 MiB boundary.
  // Its end need not be on one: the pages past the last 2 MiB boundary are 4 KiB pages.
  const uintptr_t length = round_up(bytes, kPage);
  void* raw = mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  if (const uintptr_t tail = start + length + kHugePage - (aligned + length); tail > 0)
    munmap(reinterpret_cast<void*>(aligned + length), tail);
  void* data = reinterpret_cast<void*>(aligned);
  madvise(data, length, MADV_HUGEPAGE);  // advice: where the kernel has no huge page, 4 KiB pages serve
  return data;
}

void unmap_large(void* data, size_t bytes) {
  if (data != nullptr) munmap(data, round_up(bytes, kPage));
}

at::Tensor empty_large(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (!options.device().is_cpu() || options.layout() != at::kStrided) return at::empty(sizes, options);
  const int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(options.dtype().itemsize());
  if (bytes < kLargeTensorBytes) return at::empty(sizes, options);
  void* data = map_large(static_cast<size_t>(bytes));
  if (data == nullptr) return at::empty(sizes, options);  // off, or its own out-of-memory error
  return at::from_blob(data, sizes, [bytes](void* p) { unmap_large(p, static_cast<size_t>(bytes)); }, options);
}

}  // namespace fluxmpi::nn
