#pragma once
/// Reuse of large CPU buffers while a stage runs (the text encoders, the denoising loop, the VAE).
/// Each activation of a large model or image is tens to hundreds of MiB; glibc serves such sizes
/// with a fresh mmap in 4 KiB pages and returns them with munmap, so every new tensor is
/// page-faulted in and zeroed by the kernel again, and read through a TLB entry per 4 KiB (on a
/// virtual machine, where a TLB miss walks two page tables, that doubled the time of a VAE decode:
/// docs/performance.md, "Huge pages"). While a ReuseLargeBlocks scope is open on any thread,
/// libtorch's CPU tensors come from an allocator that takes blocks of at least kMinReusedBytes as
/// huge-page mappings of their own (large_alloc.h), keeps them when freed and hands one back when a
/// tensor of exactly its size is asked for. It never makes the process hold more of these blocks
/// than the most it has had in use at once since the scope opened: before it takes a new block
/// from the system it returns kept ones (the largest first) until that holds. Blocks of a size not
/// seen before are still new pages (each level of the decoder is larger than the last), faulted in
/// 2 MiB at a time. Smaller blocks come from malloc, whose heap (with glibc) is not trimmed while a
/// scope is open, so each step's activations reuse the last step's pages; the last scope to close
/// gives the held pages back (malloc_trim).

#include <cstddef>

namespace fluxmpi::nn {

/// Blocks below this size are left to malloc: glibc raises its mmap threshold up to 32 MiB as it
/// sees such blocks freed, and then serves them again from its heap without page faults. Smaller
/// requests (oneDNN's weight reorders, the attention's chunks) are also of many sizes, which would
/// otherwise make the kept activations be returned at every other request.
inline constexpr std::size_t kMinReusedBytes = std::size_t{16} << 20;

/// RAII scope (nestable, any thread): libtorch's CPU allocator is replaced while at least one scope
/// is open; the last one to close restores the previous allocator and releases the kept blocks.
/// Tensors that outlive the scope are freed normally. If another allocator with a higher priority
/// is installed, nothing is replaced and nothing changes.
class ReuseLargeBlocks {
 public:
  ReuseLargeBlocks();
  ~ReuseLargeBlocks();
  ReuseLargeBlocks(const ReuseLargeBlocks&) = delete;
  ReuseLargeBlocks& operator=(const ReuseLargeBlocks&) = delete;
};

}  // namespace fluxmpi::nn
