#include "parallel/mpi_env.h"

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "core/log.h"
#include "parallel/mpi_internal.h"

namespace fluxmpi::parallel {

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = std::snprintf(text, sizeof text, "MPI error %d", rc);
  throw CommError(str_cat(what, " failed on rank ", log::rank(), ": ", std::string(text, length)));
}

namespace {

constexpr int kCpuWords = CPU_SETSIZE / 64;

// This process's affinity mask as 64-bit words (all online CPUs when it cannot be read).
std::vector<uint64_t> affinity_words() {
  std::vector<uint64_t> words(kCpuWords, 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) words[cpu / 64] |= uint64_t{1} << (cpu % 64);
  } else {
    const long online = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    for (long cpu = 0; cpu < online && cpu < CPU_SETSIZE; ++cpu) words[cpu / 64] |= uint64_t{1} << (cpu % 64);
  }
  return words;
}

// Whether an MPI launcher started this process (Open MPI, MPICH/Hydra, PMI/PMIx, Slurm's srun).
bool launched_by_mpi() {
  if (const char* force = std::getenv("FLUXMPI_MPI"); force && std::string(force) == "1") return true;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

int count_bits(const std::vector<uint64_t>& words) {
  int n = 0;
  for (uint64_t w : words) n += __builtin_popcountll(w);
  return std::max(n, 1);
}

}  // namespace

MpiEnv::MpiEnv(int* argc, char*** argv) : comms_(std::make_unique<Comms>()) {
  if (!launched_by_mpi()) {
    mpi_ = false;
    uncaught_at_start_ = std::uncaught_exceptions();
    log::set_rank(0, 1);
    char name[256] = {0};
    ::gethostname(name, sizeof name - 1);
    node_name_ = name;
    affinity_cpus_ = node_cpus_ = count_bits(affinity_words());
    return;
  }
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) throw InternalError("MPI is already initialised: create one MpiEnv per process");
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  uncaught_at_start_ = std::uncaught_exceptions();

  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comms_->world), "MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(comms_->world, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  auto world = std::make_unique<Communicator::Handle>();
  world->comm = comms_->world;
  world->mpi = true;
  world_ = Communicator::adopt(std::move(world));
  check_mpi(MPI_Comm_rank(comms_->world, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comms_->world, &size_), "MPI_Comm_size");
  log::set_rank(rank_, size_);
  if (provided < MPI_THREAD_FUNNELED)
    log::debug("MPI provides thread level ", provided, " < MPI_THREAD_FUNNELED; fluxmpi calls MPI from one thread only");

  check_mpi(MPI_Comm_split_type(comms_->world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &comms_->node),
            "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(comms_->node, &local_rank_), "MPI_Comm_rank (node)");
  check_mpi(MPI_Comm_size(comms_->node, &local_size_), "MPI_Comm_size (node)");

  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  check_mpi(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
  node_name_.assign(name, length);

  std::vector<uint64_t> mine = affinity_words();
  std::vector<uint64_t> node(mine.size(), 0);
  check_mpi(MPI_Allreduce(mine.data(), node.data(), static_cast<int>(mine.size()), MPI_UINT64_T, MPI_BOR, comms_->node),
            "MPI_Allreduce (node CPUs)");
  affinity_cpus_ = count_bits(mine);
  node_cpus_ = count_bits(node);
}

MpiEnv::~MpiEnv() {
  if (!mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    log::error("an exception is leaving the MPI environment; aborting the job so that no rank waits forever");
    abort(kExitFailure);
  }
  if (comms_->node != MPI_COMM_NULL) MPI_Comm_free(&comms_->node);
  world_ = Communicator();  // frees the world's duplicate
  comms_->world = MPI_COMM_NULL;
  MPI_Finalize();
}

std::string MpiEnv::broadcast_string(const std::string& value) const {
  std::vector<uint8_t> bytes = broadcast_bytes(std::vector<uint8_t>(value.begin(), value.end()));
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> MpiEnv::broadcast_bytes(const std::vector<uint8_t>& value) const {
  return world_.broadcast_bytes(value, 0);
}

std::vector<int64_t> MpiEnv::broadcast_int64s(const std::vector<int64_t>& value) const {
  if (!mpi_) return value;
  const auto* first = reinterpret_cast<const uint8_t*>(value.data());
  const std::vector<uint8_t> bytes =
      world_.broadcast_bytes(rank_ == 0 ? std::vector<uint8_t>(first, first + value.size() * sizeof(int64_t)) : std::vector<uint8_t>(), 0);
  FLUX_CHECK(bytes.size() % sizeof(int64_t) == 0, "broadcast of ", bytes.size(), " bytes as int64 values");
  std::vector<int64_t> out(bytes.size() / sizeof(int64_t));
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

int MpiEnv::agree(int local_exit_code) const {
  int result = local_exit_code;
  if (!mpi_) return result;
  // Ranks agree after loading, where the others wait for rank 0's encoders: quietly.
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallreduce(&local_exit_code, &result, 1, MPI_INT, MPI_MAX, comms_->world, &request),
            "MPI_Allreduce (agree)");
  wait_quietly(request, "MPI_Allreduce (agree)");
  return result;
}

std::vector<std::string> MpiEnv::node_names() const {
  std::vector<std::string> out;
  for (const auto& bytes : world_.all_gather_bytes(std::vector<uint8_t>(node_name_.begin(), node_name_.end())))
    out.emplace_back(bytes.begin(), bytes.end());
  return out;
}

void MpiEnv::barrier() const {
  if (mpi_) check_mpi(MPI_Barrier(comms_->world), "MPI_Barrier");
}

void MpiEnv::abort(int code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this only guards a broken MPI
}

}  // namespace fluxmpi::parallel
