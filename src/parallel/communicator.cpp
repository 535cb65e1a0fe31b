#include "parallel/communicator.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "parallel/mpi_internal.h"

namespace fluxmpi::parallel {

Communicator::Communicator() : handle_(std::make_unique<Handle>()) {}

Communicator::~Communicator() {
  if (!handle_ || !handle_->mpi || handle_->comm == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&handle_->comm);
}

Communicator::Communicator(Communicator&& other) noexcept
    : handle_(std::move(other.handle_)), rank_(other.rank_), size_(other.size_), world_ranks_(std::move(other.world_ranks_)) {
  other.handle_ = std::make_unique<Handle>();
  other.rank_ = 0;
  other.size_ = 1;
  other.world_ranks_ = {0};
}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    Communicator dead(std::move(*this));  // frees the old communicator
    handle_ = std::move(other.handle_);
    rank_ = other.rank_;
    size_ = other.size_;
    world_ranks_ = std::move(other.world_ranks_);
    other.handle_ = std::make_unique<Handle>();
    other.rank_ = 0;
    other.size_ = 1;
    other.world_ranks_ = {0};
  }
  return *this;
}

bool Communicator::uses_mpi() const { return handle_->mpi; }

int Communicator::world_rank(int rank) const {
  FLUX_CHECK(rank >= 0 && rank < size_, "rank ", rank, " of a communicator of ", size_);
  return world_ranks_[static_cast<size_t>(rank)];
}

Communicator Communicator::adopt(std::unique_ptr<Handle> handle) {
  Communicator c;
  c.handle_ = std::move(handle);
  if (c.handle_->comm == MPI_COMM_NULL) {
    c.rank_ = -1;
    c.size_ = 0;
    c.world_ranks_.clear();
    return c;
  }
  MPI_Comm comm = c.handle_->comm;
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(comm, &c.rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &c.size_), "MPI_Comm_size");
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(comm, &group), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group (world)");
  std::vector<int> members(static_cast<size_t>(c.size_));
  for (int r = 0; r < c.size_; ++r) members[static_cast<size_t>(r)] = r;
  c.world_ranks_.assign(members.size(), MPI_UNDEFINED);
  const int rc = MPI_Group_translate_ranks(group, c.size_, members.data(), world, c.world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  check_mpi(rc, "MPI_Group_translate_ranks");
  return c;
}

Communicator Communicator::split(int color, int key) const {
  FLUX_CHECK(!empty(), "split of an empty communicator");
  if (!handle_->mpi) {
    if (color < 0) return adopt(std::make_unique<Handle>());
    return Communicator();
  }
  auto h = std::make_unique<Handle>();
  h->mpi = true;
  check_mpi(MPI_Comm_split(handle_->comm, color < 0 ? MPI_UNDEFINED : color, key, &h->comm), "MPI_Comm_split");
  return adopt(std::move(h));
}

std::vector<uint8_t> Communicator::broadcast_bytes(const std::vector<uint8_t>& value, int root) const {
  if (!handle_->mpi) return value;
  // The members wait here for a late root (rank 0 validating or encoding while the others are
  // ready): the size is waited for quietly, so that they leave their cores to the ranks that
  // compute; the root sends the payload right after it, at full speed with blocking calls.
  int64_t size = static_cast<int64_t>(value.size());
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibcast(&size, 1, MPI_INT64_T, root, handle_->comm, &request), "MPI_Bcast (size)");
  wait_quietly(request, "MPI_Bcast (size)");
  std::vector<uint8_t> out = rank_ == root ? value : std::vector<uint8_t>(static_cast<size_t>(size));
  broadcast_in_place(out.data(), size, root);
  return out;
}

void Communicator::broadcast_in_place(void* data, int64_t bytes, int root) const {
  if (!handle_->mpi) return;
  constexpr int64_t kPiece = int64_t{1} << 30;  // MPI counts are int
  for (int64_t offset = 0; offset < bytes; offset += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, bytes - offset));
    check_mpi(MPI_Bcast(static_cast<uint8_t*>(data) + offset, count, MPI_BYTE, root, handle_->comm), "MPI_Bcast (bytes)");
  }
}

std::vector<std::vector<uint8_t>> Communicator::all_gather_bytes(const std::vector<uint8_t>& value) const {
  if (!handle_->mpi) return {value};
  FLUX_CHECK(value.size() < (size_t{1} << 30), "all-gather of ", value.size(), " bytes");
  const int mine = static_cast<int>(value.size());
  std::vector<int> counts(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, handle_->comm), "MPI_Allgather (sizes)");
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[static_cast<size_t>(r)] = static_cast<int>(total);
    total += counts[static_cast<size_t>(r)];
  }
  FLUX_CHECK(total < (int64_t{1} << 31), "all-gather of ", total, " bytes");
  std::vector<uint8_t> all(static_cast<size_t>(total));
  check_mpi(MPI_Allgatherv(value.data(), mine, MPI_BYTE, all.data(), counts.data(), offsets.data(), MPI_BYTE, handle_->comm),
            "MPI_Allgatherv");
  std::vector<std::vector<uint8_t>> out;
  for (int r = 0; r < size_; ++r) {
    const auto* first = all.data() + offsets[static_cast<size_t>(r)];
    out.emplace_back(first, first + counts[static_cast<size_t>(r)]);
  }
  return out;
}

void wait_quietly(MPI_Request& request, const std::string& what, MPI_Status* status, const std::function<void()>& idle) {
  int done = 0;
  for (int64_t pause_us = 1;;) {
    check_mpi(MPI_Test(&request, &done, status), what);
    if (done) return;
    if (idle) {
      idle();
      check_mpi(MPI_Test(&request, &done, status), what);
      if (done) return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    pause_us = std::min<int64_t>(2 * pause_us, 200);
  }
}

void Communicator::quiet_barrier() const {
  if (!handle_->mpi) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(handle_->comm, &request), "MPI_Ibarrier");
  wait_quietly(request, "MPI_Test (barrier)");
}

}  // namespace fluxmpi::parallel
