#pragma once
/// Reuse of large CPU buffers while the VAE runs. Each of the decoder's activations at a large
/// image is tens to hundreds of MiB; glibc serves such sizes with a fresh mmap and returns them
/// with munmap, so every new tensor is page-faulted in and zeroed by the kernel again (measured:
/// about a fifth of the CPU time of a 512^2 decode of FLUX.1's VAE on libtorch 1.13 was kernel
/// time). While a ReuseLargeBlocks scope is open on any thread, libtorch's CPU tensors come from an
/// allocator that keeps freed blocks of at least kMinReusedBytes and hands one back when a tensor
/// of exactly its size is asked for. It never makes the process hold more of these blocks than the
/// most it has had in use at once since the scope opened: before it takes a new block from the
/// system it returns kept ones (the largest first) until that holds. Blocks of a size not seen
/// before are still new pages (each level of the decoder is larger than the last), so this halves
/// the page faults of a decode rather than removing them (measured: 708 of 1524 MiB of a 256^2
/// decode came fresh from the system).

#include <cstddef>

namespace fluxmpi::vae {

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

}  // namespace fluxmpi::vae
