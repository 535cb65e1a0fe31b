#pragma once
// The runtime baseline of the ranks after rank 0, beside kRuntimeBaselineBytes (partition.h), which
// stays rank 0's. A header of its own so that the memory model's other users need not be rebuilt
// for it (docs/partition.md, "The memory model").
#include <cstdint>

namespace fluxmpi::parallel {

/// Resident memory of a rank after rank 0 before its blocks, in its denoising stage: libtorch,
/// OpenBLAS and Open MPI initialised, no tokenizers (ICU, sentencepiece), no checkpoint writer or
/// PNG. Measured 153-172 MiB before loading on libtorch 1.13 and 159 MiB for a fresh process on
/// libtorch 2.6 (docs/performance.md, "ControlNet: memory against the plan");
/// tests/mpi/env_test.cpp checks that a fresh process stays below it.
inline constexpr uint64_t kWorkerRuntimeBaselineBytes = 208ull << 20;

}  // namespace fluxmpi::parallel
