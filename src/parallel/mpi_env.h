#pragma once
/// The MPI environment of one fluxmpi process: initialisation and finalisation, where this rank
/// sits (world and node), and the few collectives the program needs. Created once in main and
/// passed by reference; <mpi.h> stays inside src/parallel/*.cpp.
///
/// A program started without an MPI launcher (no mpirun/mpiexec/srun environment) runs as rank 0
/// of 1 without initialising MPI at all: Open MPI's singleton start-up costs ~2 s and P = 1 needs
/// no MPI (collectives are identities, abort exits). FLUXMPI_MPI=1 forces MPI initialisation
/// (singleton) anyway.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace fluxmpi::parallel {

class MpiEnv {
 public:
  /// MPI_Init_thread with MPI_THREAD_FUNNELED: only the thread that created the environment calls
  /// MPI (libtorch's worker threads never do). Sets the rank shown by core/log.h. Throws
  /// InternalError when MPI was initialised before (one MpiEnv per process).
  MpiEnv(int* argc, char*** argv);
  /// MPI_Finalize. When an exception is unwinding past the environment, other ranks may be
  /// waiting for this one and would hang: the job is aborted instead (exit code 1).
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  /// False in a single process started without an MPI launcher (MPI not initialised).
  bool mpi_initialised() const { return mpi_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }
  /// Rank among the processes of this node (MPI_COMM_TYPE_SHARED), and how many there are.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  /// MPI_Get_processor_name.
  const std::string& node_name() const { return node_name_; }
  /// CPUs this node's ranks may run on together: the union of their affinity masks (all online
  /// CPUs unless the launcher binds ranks to cores).
  int node_cpus() const { return node_cpus_; }
  /// CPUs this process may run on (its affinity mask).
  int affinity_cpus() const { return affinity_cpus_; }

  /// Rank 0's value on every rank. Collective: the others wait for rank 0 without spinning
  /// (Communicator::broadcast_bytes).
  std::string broadcast_string(const std::string& value) const;
  std::vector<uint8_t> broadcast_bytes(const std::vector<uint8_t>& value) const;
  std::vector<int64_t> broadcast_int64s(const std::vector<int64_t>& value) const;
  /// The largest exit code over all ranks, on every rank (allreduce max): after a collective phase
  /// such as loading, every rank exits with the same code. Collective; a rank that waits for the
  /// others sleeps between polls (wait_quietly in parallel/mpi_internal.h).
  int agree(int local_exit_code) const;
  void barrier() const;
  /// Ends the whole job now (MPI_Abort on MPI_COMM_WORLD) with `code`. For failures after start-up
  /// on one rank, when others may be waiting for it.
  [[noreturn]] void abort(int code) const;

  /// Every rank of the job (a duplicate of MPI_COMM_WORLD; this process alone without MPI).
  const Communicator& world() const { return world_; }
  /// The processor name of every rank, in rank order. Collective.
  std::vector<std::string> node_names() const;

  /// Communicators, kept out of this header (defined in parallel/mpi_internal.h).
  struct Comms;
  const Comms& comms() const { return *comms_; }

 private:
  std::unique_ptr<Comms> comms_;
  Communicator world_;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int node_cpus_ = 1;
  int affinity_cpus_ = 1;
  std::string node_name_;
  int uncaught_at_start_ = 0;
  bool mpi_ = true;
};

}  // namespace fluxmpi::parallel
