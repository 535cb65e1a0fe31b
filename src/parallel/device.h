#pragma once
/// Device and thread binding of one rank (DESIGN.md §2): `--device cuda` gives rank r the GPU
/// cuda:(local rank mod visible GPUs); `--device cpu` runs on the CPU with `--threads` threads,
/// by default max(1, CPUs of the node / ranks on the node).

#include <ATen/Device.h>

#include <string>

#include "parallel/mpi_env.h"

namespace fluxmpi::parallel {

/// "cpu" -> kCPU; "cuda" -> cuda:(env.local_rank() % visible GPUs). UsageError naming --device
/// for other flags, for a libtorch built without CUDA, and when no GPU is visible.
at::Device select_device(const std::string& flag, const MpiEnv& env);
/// The same rule for a given local rank.
at::Device select_device(const std::string& flag, int local_rank);

/// DESIGN.md §2: max(1, node_cpus / ranks_on_node).
int default_threads(int node_cpus, int ranks_on_node);

/// `--threads` for this rank: `requested` when > 0, else default_threads(env.node_cpus(),
/// env.local_size()). Warns when the threads exceed the CPUs this process may run on (a launcher
/// that binds each rank to one core: use `mpirun --bind-to none` or a wider binding).
int resolve_threads(int requested, const MpiEnv& env);

/// at::set_num_threads(threads) and at::set_num_interop_threads(threads). libtorch accepts the
/// inter-op count only once per process, before any inter-op work: later calls keep the first
/// value (noted in the debug log).
void apply_threads(int threads);

}  // namespace fluxmpi::parallel
