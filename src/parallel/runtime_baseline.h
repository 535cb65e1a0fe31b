#pragma once
// The runtime baseline of the ranks after rank 0, beside kRuntimeBaselineBytes (partition.h), which
// stays rank 0's. A header of its own so that the memory model's other users need not be rebuilt
// for it (docs/partition.md, "The memory model").
#include <cstdint>

namespace fluxmpi::parallel {

/// Resident memory of a rank after rank 0 in its denoising stage, its blocks and activations aside:
/// libtorch, OpenBLAS and Open MPI initialised (59 MiB anonymous), and the code pages of the shared
/// libraries it has touched once it computes (104-123 MiB); no tokenizers (ICU, sentencepiece), no
/// checkpoint writer or PNG. Measured 163-168 MiB before loading, 176 MiB with a tiny model's step
/// on libtorch 1.13, a fresh process 159-165 MiB (docs/performance.md, "ControlNet: memory against
/// the plan"); tests/mpi/env_test.cpp checks that a fresh process stays below it.
inline constexpr uint64_t kWorkerRuntimeBaselineBytes = 176ull << 20;

}  // namespace fluxmpi::parallel
