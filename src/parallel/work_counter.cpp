#include "parallel/work_counter.h"

#include "core/error.h"
#include "parallel/mpi_internal.h"

namespace fluxmpi::parallel {

struct WorkCounter::Window {
  MPI_Win win = MPI_WIN_NULL;
  int64_t* value = nullptr;  // on leaders' rank 0: the counter
  int64_t local = 0;         // without MPI: the counter itself
};

WorkCounter::WorkCounter(const Communicator& leaders, int64_t limit)
    : leaders_(leaders), limit_(limit), window_(std::make_unique<Window>()) {
  FLUX_CHECK(!leaders.empty() && limit >= 0, "work counter over ", leaders.size(), " leaders, limit ", limit);
  if (!leaders.uses_mpi()) return;
  const MPI_Aint bytes = leaders.rank() == 0 ? sizeof(int64_t) : 0;
  check_mpi(MPI_Win_allocate(bytes, sizeof(int64_t), MPI_INFO_NULL, leaders.handle().comm, &window_->value, &window_->win),
            "MPI_Win_allocate (work counter)");
  if (leaders.rank() == 0) *window_->value = 0;
  // The counter is initialised before anyone reads it.
  check_mpi(MPI_Barrier(leaders.handle().comm), "MPI_Barrier (work counter)");
  check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_->win), "MPI_Win_lock_all (work counter)");
}

WorkCounter::~WorkCounter() = default;

std::optional<int64_t> WorkCounter::take() {
  FLUX_CHECK(window_ != nullptr, "work counter used after close()");
  int64_t got = 0;
  if (!leaders_.uses_mpi()) {
    got = window_->local++;
  } else {
    const int64_t one = 1;
    check_mpi(MPI_Fetch_and_op(&one, &got, MPI_INT64_T, 0, 0, MPI_SUM, window_->win), "MPI_Fetch_and_op (work counter)");
    check_mpi(MPI_Win_flush(0, window_->win), "MPI_Win_flush (work counter)");
  }
  if (got >= limit_) return std::nullopt;
  ++taken_;
  return got;
}

void WorkCounter::close() {
  FLUX_CHECK(window_ != nullptr, "work counter closed twice");
  if (leaders_.uses_mpi()) {
    check_mpi(MPI_Win_unlock_all(window_->win), "MPI_Win_unlock_all (work counter)");
    leaders_.quiet_barrier();
    check_mpi(MPI_Win_free(&window_->win), "MPI_Win_free (work counter)");
  }
  window_.reset();
}

}  // namespace fluxmpi::parallel
