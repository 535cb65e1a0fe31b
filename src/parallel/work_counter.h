#pragma once
/// The job's shared counter of work groups under `--stages` (several pipelines): an MPI window
/// holding one int64 on world rank 0, advanced with MPI_Fetch_and_op by whichever leader has room
/// for another group. Passive target: rank 0's thread takes no part (with Open MPI's shared-memory
/// or RDMA one-sided components; over TCP the request progresses whenever rank 0 enters MPI, which
/// it does between units of work and while it waits for messages).

#include <cstdint>
#include <optional>

#include "parallel/communicator.h"

namespace fluxmpi::parallel {

class WorkCounter {
 public:
  /// Collective over `leaders`: a counter starting at 0 on its rank 0, handing out 0 .. limit-1.
  WorkCounter(const Communicator& leaders, int64_t limit);
  /// Without close(): the window is left to MPI_Finalize or the job's abort (freeing it is
  /// collective and must not happen while an exception unwinds).
  ~WorkCounter();
  WorkCounter(const WorkCounter&) = delete;
  WorkCounter& operator=(const WorkCounter&) = delete;

  /// The next index, or none once `limit` have been handed out (to anyone).
  std::optional<int64_t> take();
  /// Indices this rank has taken.
  int64_t taken() const { return taken_; }
  /// Collective: waits (sleeping, Communicator::quiet_barrier) until every leader is done, then
  /// frees the window.
  void close();

 private:
  struct Window;
  const Communicator& leaders_;
  int64_t limit_;
  int64_t taken_ = 0;
  std::unique_ptr<Window> window_;
};

}  // namespace fluxmpi::parallel
