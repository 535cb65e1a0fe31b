#include "parallel/device.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace fluxmpi::parallel {

at::Device select_device(const std::string& flag, const MpiEnv& env) { return select_device(flag, env.local_rank()); }

at::Device select_device(const std::string& flag, int local_rank) {
  if (flag == "cpu") return at::Device(at::kCPU);
  if (flag != "cuda") throw UsageError(str_cat("--device must be 'cpu' or 'cuda', got '", flag, "'"));
  if (!at::hasCUDA())
    throw UsageError("--device cuda: this fluxmpi is linked against a libtorch built without CUDA support "
                     "(Debian's libtorch is CPU-only); use --device cpu or rebuild against a CUDA libtorch");
  const int gpus = static_cast<int>(at::getNumGPUs());
  if (gpus < 1)
    throw UsageError("--device cuda: no GPU is visible to this process (check CUDA_VISIBLE_DEVICES and the driver)");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus));
}

int default_threads(int node_cpus, int ranks_on_node) { return std::max(1, node_cpus / std::max(1, ranks_on_node)); }

int resolve_threads(int requested, const MpiEnv& env) {
  if (requested < 0) throw UsageError(str_cat("--threads must be positive (or 0 for the default), got ", requested));
  const int threads = requested > 0 ? requested : default_threads(env.node_cpus(), env.local_size());
  if (threads > env.affinity_cpus()) {
    if (env.affinity_cpus() < env.node_cpus())
      log::warn(threads, " threads, but the launcher binds this rank to ", env.affinity_cpus(),
                " CPU(s); with mpirun use --bind-to none (or --map-by slot:PE=", threads, ")");
    else
      log::warn(threads, " threads on ", env.affinity_cpus(), " CPU(s): the threads will share cores");
  }
  return threads;
}

void apply_threads(int threads) {
  FLUX_CHECK(threads >= 1, "thread count ", threads);
  at::set_num_threads(threads);
  try {
    at::set_num_interop_threads(threads);
  } catch (const c10::Error&) {
    // Already set, or inter-op work has started: libtorch keeps its first value.
    log::debug("inter-op threads stay at ", at::get_num_interop_threads(), " (requested ", threads, ")");
  }
}

}  // namespace fluxmpi::parallel
