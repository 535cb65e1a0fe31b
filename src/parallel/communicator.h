#pragma once
/// A group of ranks that talk to each other: the job's world, one pipeline's S ranks, the leaders
/// of the pipelines (`--stages`, parallel/pipelines.h). Each object owns its MPI communicator (a
/// duplicate or a split, freed with it) and is passed by reference to whatever sends, receives or
/// synchronises over it — never a global. Messages and errors name world ranks: world_rank()
/// translates. <mpi.h> stays in src/parallel/*.cpp (the handle is in parallel/mpi_internal.h).

#include <cstdint>
#include <memory>
#include <vector>

namespace fluxmpi::parallel {

class Communicator {
 public:
  /// This process alone, without MPI (a job started without an MPI launcher): size 1, collectives
  /// are identities.
  Communicator();
  /// Frees the MPI communicator (unless MPI is already finalised).
  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// This rank's index in the group, and the group's size; a rank outside the group (an empty
  /// communicator from split) has size 0 and rank -1.
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool empty() const { return size_ == 0; }
  /// Whether messages go through MPI (false for the single process without a launcher).
  bool uses_mpi() const;
  /// The world rank of member `rank`.
  int world_rank(int rank) const;
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  /// MPI_Comm_split: the members that pass the same `color` form one new communicator, ordered by
  /// `key`; color < 0 (MPI_UNDEFINED) leaves this rank out (it gets an empty communicator).
  /// Collective over this communicator. The new one reports errors as exceptions, as this one.
  Communicator split(int color, int key) const;

  /// The root's bytes on every member (in pieces: MPI counts are int). Collective; the members
  /// wait for the root's first message without spinning, then receive at full speed.
  std::vector<uint8_t> broadcast_bytes(const std::vector<uint8_t>& value, int root = 0) const;
  /// The root's `bytes` bytes at `data` into every member's `data` (same size everywhere). Collective.
  void broadcast_in_place(void* data, int64_t bytes, int root = 0) const;
  /// Every member's bytes, in member order. Collective.
  std::vector<std::vector<uint8_t>> all_gather_bytes(const std::vector<uint8_t>& value) const;
  /// A barrier whose waiting rank sleeps between polls (MPI_Ibarrier and MPI_Test with pauses of at
  /// most 200 us) instead of busy-polling a core, as Messenger's receives do: a rank that is done
  /// leaves the cores it shares to those still computing. Collective.
  void quiet_barrier() const;

  /// The MPI handle (parallel/mpi_internal.h); only src/parallel uses it.
  struct Handle;
  const Handle& handle() const { return *handle_; }

  /// Wraps `handle` (taking ownership of its communicator when `owned`): the world's duplicate in
  /// MpiEnv, the results of split().
  static Communicator adopt(std::unique_ptr<Handle> handle);

 private:
  std::unique_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_{0};
};

}  // namespace fluxmpi::parallel
