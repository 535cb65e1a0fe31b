#include "parallel/tensor_broadcast.h"

#include <cstring>

#include "core/error.h"

namespace fluxmpi::parallel {
namespace {

// The description of the tensors: their count, then per tensor its dtype (-1: undefined), its
// number of dimensions and its sizes.
std::vector<int64_t> describe(const std::vector<at::Tensor>& tensors) {
  std::vector<int64_t> d = {static_cast<int64_t>(tensors.size())};
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) {
      d.push_back(-1);
      continue;
    }
    d.push_back(static_cast<int64_t>(t.scalar_type()));
    d.push_back(t.dim());
    for (int64_t s : t.sizes()) d.push_back(s);
  }
  return d;
}

std::vector<uint8_t> as_bytes(const std::vector<int64_t>& words) {
  std::vector<uint8_t> b(words.size() * sizeof(int64_t));
  std::memcpy(b.data(), words.data(), b.size());
  return b;
}

}  // namespace

void broadcast_tensors(const Communicator& comm, std::vector<at::Tensor>& tensors, int root) {
  if (!comm.uses_mpi() || comm.size() == 1) return;
  const bool sending = comm.rank() == root;
  std::vector<at::Tensor> host;
  if (sending)
    for (const at::Tensor& t : tensors) host.push_back(t.defined() ? t.to(at::kCPU).contiguous() : at::Tensor());
  const std::vector<uint8_t> bytes = comm.broadcast_bytes(sending ? as_bytes(describe(host)) : std::vector<uint8_t>(), root);
  FLUX_CHECK(bytes.size() % sizeof(int64_t) == 0 && !bytes.empty(), "tensor description of ", bytes.size(), " bytes");
  std::vector<int64_t> d(bytes.size() / sizeof(int64_t));
  std::memcpy(d.data(), bytes.data(), bytes.size());
  if (!sending) {
    size_t at = 1;
    auto word = [&]() {
      FLUX_CHECK(at < d.size(), "truncated tensor description");
      return d[at++];
    };
    for (int64_t i = 0; i < d[0]; ++i) {
      const int64_t type = word();
      if (type < 0) {
        host.emplace_back();
        continue;
      }
      std::vector<int64_t> shape(static_cast<size_t>(word()));
      for (int64_t& s : shape) s = word();
      host.push_back(at::empty(shape, at::TensorOptions().dtype(static_cast<at::ScalarType>(type))));
    }
  }
  // The payloads, one broadcast each (a job's inputs are a few tensors per work group).
  for (at::Tensor& t : host)
    if (t.defined() && t.numel() > 0) comm.broadcast_in_place(t.data_ptr(), static_cast<int64_t>(t.nbytes()), root);
  if (!sending) tensors = std::move(host);
}

}  // namespace fluxmpi::parallel
