#pragma once

// Large CPU tensors in mappings of their own, backed by transparent huge pages.
//
// Loading a model writes every weight into fresh memory, some twice (widened to fp32, then laid out
// for the GEMM, cpu_linear.h). In 4 KiB pages that is one page fault per 4 KiB and a TLB miss on
// nearly every row of a tiled transpose: on a virtual machine those made most of a width-3072
// model's load (docs/performance.md, "Start-up"). A tensor from `empty_large` lives in an
// anonymous mapping aligned to 2 MiB and advised for huge pages (MADV_HUGEPAGE), so the kernel
// faults it in 2 MiB at a time where it can; freeing the tensor unmaps it, so its memory goes back
// to the system at once instead of staying in the allocator's heap.
#include <ATen/ATen.h>

#include <cstddef>

namespace fluxmpi::nn {

// A mapping of `bytes` (rounded up to 4 KiB) that starts on a 2 MiB boundary, advised for huge
// pages; nullptr when the mappings are off (FLUXMPI_HUGE_PAGES=0) or mmap fails. Give it back with
// unmap_large and the same `bytes`.
void* map_large(size_t bytes);
void unmap_large(void* data, size_t bytes);

// The smallest tensor, in bytes, that empty_large maps on its own; smaller ones stay in malloc's
// heap. From 1 MiB on, a weight's own mapping also keeps the heap from holding the memory of the
// weights freed while loading (the fp32 copies that the GEMM layout replaces), which glibc would
// otherwise keep for later (docs/performance.md, "Huge pages").
constexpr int64_t kLargeTensorBytes = int64_t{1} << 20;

// An uninitialised tensor: on the CPU and of kLargeTensorBytes or more, in its own huge-page
// mapping; otherwise (or if the mapping fails, or FLUXMPI_HUGE_PAGES=0) at::empty.
at::Tensor empty_large(at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace fluxmpi::nn
