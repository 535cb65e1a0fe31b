#include "parallel/message.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "parallel/mpi_internal.h"
#include "models/common/tensor_utils.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

namespace fluxmpi::parallel {
namespace {

constexpr int64_t kMagic = 0x464c55584d5049;  // "FLUXMPI"
constexpr int64_t kVersion = 2;  // 2: the patch word
constexpr int kHeaderTag = 7101;
constexpr int kPayloadTag = 7102;
// MPI counts are int: payloads go in pieces of at most this many bytes.
constexpr int64_t kPieceBytes = int64_t{1} << 30;

int64_t dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 1;
    case at::kBFloat16: return 2;
    case at::kHalf: return 3;
    case at::kByte: return 4;  // decoded images
    default: return 0;
  }
}

std::optional<at::ScalarType> dtype_of_code(int64_t code) {
  switch (code) {
    case 1: return at::kFloat;
    case 2: return at::kBFloat16;
    case 3: return at::kHalf;
    case 4: return at::kByte;
    default: return std::nullopt;
  }
}

bool known_kind(int64_t kind) { return kind >= 1 && kind <= 12; }

bool mpi_is_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

// Kernels run asynchronously on the device's current stream: MPI may touch device memory only
// after they are done.
void synchronize_device(const at::Device& device) {
  c10::impl::VirtualGuardImpl guard(device.type());
  guard.getStream(device).synchronize();
}

// Pieces of [data, data + bytes) of at most kPieceBytes each.
template <typename F>
void for_each_piece(uint8_t* data, int64_t bytes, F f) {
  for (int64_t offset = 0; offset < bytes; offset += kPieceBytes)
    f(data + offset, static_cast<int>(std::min(kPieceBytes, bytes - offset)));
}

}  // namespace

const char* message_kind_name(MessageKind kind) {
  switch (kind) {
    case MessageKind::DoubleStreams: return "DoubleStreams";
    case MessageKind::JointStream: return "JointStream";
    case MessageKind::NoisePred: return "NoisePred";
    case MessageKind::TextHidden: return "TextHidden";
    case MessageKind::TextStates: return "TextStates";
    case MessageKind::DecodeLatents: return "DecodeLatents";
    case MessageKind::DecodedTile: return "DecodedTile";
    case MessageKind::End: return "End";
    case MessageKind::StepRow: return "StepRow";
    case MessageKind::ImagePixels: return "ImagePixels";
    case MessageKind::LeaderDone: return "LeaderDone";
    case MessageKind::ControlResiduals: return "ControlResiduals";
  }
  return "UnknownKind";
}

int64_t TensorSpec::nbytes() const {
  int64_t n = static_cast<int64_t>(at::elementSize(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

MessageHeader MessageHeader::of(const MessageTag& tag, const std::vector<at::Tensor>& tensors) {
  MessageHeader h;
  h.tag = tag;
  for (const at::Tensor& t : tensors) h.tensors.push_back(TensorSpec{t.scalar_type(), t.sizes().vec()});
  return h;
}

std::string MessageHeader::describe() const {
  std::string s = str_cat(message_kind_name(tag.kind), "(image ", tag.image, ", step ", tag.step, ", pass ", tag.pass);
  if (tag.patch >= 0) s += str_cat(", patch ", tag.patch);
  for (const TensorSpec& t : tensors) s += str_cat(", ", nn::dtype_label(t.dtype), " ", nn::shape_string(t.shape));
  return s + ")";
}

bool MessageHeader::operator==(const MessageHeader& o) const {
  if (tag.kind != o.tag.kind || tag.image != o.tag.image || tag.step != o.tag.step || tag.pass != o.tag.pass ||
      tag.patch != o.tag.patch)
    return false;
  if (tensors.size() != o.tensors.size()) return false;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].dtype != o.tensors[i].dtype || tensors[i].shape != o.tensors[i].shape) return false;
  return true;
}

HeaderWords encode_header(const MessageHeader& h) {
  FLUX_CHECK(!h.tensors.empty() && h.tensors.size() <= static_cast<size_t>(kMaxMessageTensors), "a message carries 1 to ",
             kMaxMessageTensors, " tensors, got ", h.tensors.size());
  HeaderWords w{};
  w[0] = kMagic;
  w[1] = kVersion;
  w[2] = static_cast<int64_t>(h.tag.kind);
  w[3] = h.tag.image;
  w[4] = h.tag.step;
  w[5] = h.tag.pass;
  w[6] = static_cast<int64_t>(h.tensors.size());
  w[kHeaderPatchWord] = h.tag.patch;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorSpec& t = h.tensors[i];
    FLUX_CHECK(dtype_code(t.dtype) != 0, "message tensor ", i, " has dtype ", t.dtype, "; messages carry fp32, bf16, fp16 or uint8");
    FLUX_CHECK(t.shape.size() <= static_cast<size_t>(kMaxTensorDims), "message tensor ", i, " has ", t.shape.size(),
               " dimensions (at most ", kMaxTensorDims, ")");
    int64_t* slot = &w[7 + i * (2 + kMaxTensorDims)];
    slot[0] = dtype_code(t.dtype);
    slot[1] = static_cast<int64_t>(t.shape.size());
    std::copy(t.shape.begin(), t.shape.end(), slot + 2);
  }
  return w;
}

MessageHeader decode_header(const HeaderWords& w, int sender, int receiver) {
  auto malformed = [&](const std::string& why) {
    return CommError(str_cat("rank ", receiver, " received a malformed message header from rank ", sender, ": ", why));
  };
  if (w[0] != kMagic) throw malformed(str_cat("bad magic number 0x", std::hex, w[0]));
  if (w[1] != kVersion) throw malformed(str_cat("protocol version ", w[1], ", this build speaks ", kVersion));
  if (!known_kind(w[2])) throw malformed(str_cat("unknown message kind ", w[2]));
  if (w[5] < 0 || w[5] > 1) throw malformed(str_cat("pass ", w[5], " (must be 0 or 1)"));
  if (w[6] < 1 || w[6] > kMaxMessageTensors) throw malformed(str_cat(w[6], " tensors (1 to ", kMaxMessageTensors, ")"));
  const int64_t patch = w[kHeaderPatchWord];
  if (patch < -1 || patch > std::numeric_limits<int32_t>::max())
    throw malformed(str_cat("patch ", patch, " (must be -1 or a patch index)"));
  MessageHeader h;
  h.tag = MessageTag{static_cast<MessageKind>(w[2]), w[3], w[4], static_cast<int32_t>(w[5]), static_cast<int32_t>(patch)};
  for (int64_t i = 0; i < w[6]; ++i) {
    const int64_t* slot = &w[7 + i * (2 + kMaxTensorDims)];
    auto dtype = dtype_of_code(slot[0]);
    if (!dtype) throw malformed(str_cat("tensor ", i, " has unknown dtype code ", slot[0]));
    if (slot[1] < 0 || slot[1] > kMaxTensorDims) throw malformed(str_cat("tensor ", i, " has ", slot[1], " dimensions"));
    TensorSpec t{*dtype, std::vector<int64_t>(slot + 2, slot + 2 + slot[1])};
    for (int64_t d : t.shape)
      if (d < 0) throw malformed(str_cat("tensor ", i, " has negative size ", d));
    h.tensors.push_back(std::move(t));
  }
  return h;
}

void check_header(const MessageHeader& expected, const MessageHeader& actual, int sender, int receiver) {
  if (expected == actual) return;
  throw CommError(str_cat("rank ", receiver, " expected ", expected.describe(), " from rank ", sender, ", got ",
                          actual.describe()));
}

namespace {

// Adds the lifetime of this object to a counter of blocked seconds.
class BlockedTimer {
 public:
  explicit BlockedTimer(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~BlockedTimer() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  BlockedTimer(const BlockedTimer&) = delete;
  BlockedTimer& operator=(const BlockedTimer&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

// One posted send: its requests and everything they read from.
struct Messenger::Pending {
  uint64_t id = 0;
  int dest = 0;
  HeaderWords header{};
  std::vector<at::Tensor> buffers;  // the tensors, or their pinned host copies
  std::vector<MPI_Request> requests;

  bool test() {
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
              str_cat("MPI_Testall (send to rank ", dest, ")"));
    return done != 0;
  }
  void wait() {
    check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
              str_cat("MPI_Waitall (send to rank ", dest, ")"));
  }
};

// The receive poll_any keeps posted between calls.
struct Messenger::AnyReceive {
  HeaderWords words{};
  MPI_Request request = MPI_REQUEST_NULL;
};

Messenger::Messenger(const Communicator& comm, size_t max_outstanding, SendMode mode)
    : comm_(comm), max_outstanding_(max_outstanding), mode_(mode), uncaught_at_start_(std::uncaught_exceptions()) {
  FLUX_CHECK(comm.uses_mpi() && !comm.empty(), "messages need MPI: this process was not started by an MPI launcher");
  cuda_aware_ = mpi_is_cuda_aware();
}

Messenger::Messenger(const MpiEnv& env, size_t max_outstanding) : Messenger(env.world(), max_outstanding) {}

Messenger::~Messenger() {
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    // MPI may still read these buffers until the job aborts: never free them under a request.
    new std::vector<std::unique_ptr<Pending>>(std::move(pending_));
    if (any_) any_.release();  // the posted receive may still write into its words
    return;
  }
  if (any_ && any_->request != MPI_REQUEST_NULL) {
    MPI_Cancel(&any_->request);
    MPI_Wait(&any_->request, MPI_STATUS_IGNORE);
  }
  try {
    wait_all();
  } catch (const Error& e) {
    log::report(e);
  }
}

SendHandle Messenger::send(int dest, const MessageTag& tag, std::vector<at::Tensor> tensors) {
  FLUX_CHECK(dest >= 0 && dest < comm_.size(), "send to rank ", dest, " of ", comm_.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    FLUX_CHECK(tensors[i].is_contiguous(), "message tensor ", i, " of ", message_kind_name(tag.kind), " is not contiguous");
  if (max_outstanding_ > 0) wait_until_at_most(max_outstanding_ - 1);

  auto p = std::make_unique<Pending>();
  p->id = next_id_++;
  p->dest = dest;
  p->header = encode_header(MessageHeader::of(tag, tensors));
  for (at::Tensor& t : tensors) {
    if (t.is_cuda() && !cuda_aware_) {
      at::Tensor host = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(true));
      host.copy_(t);  // synchronous: the host copy is complete when this returns
      p->buffers.push_back(std::move(host));
    } else {
      if (t.is_cuda()) synchronize_device(t.device());
      p->buffers.push_back(std::move(t));
    }
  }
  MPI_Comm comm = comm_.handle().comm;
  auto post = mode_ == SendMode::Synchronous ? MPI_Issend : MPI_Isend;
  p->requests.emplace_back();
  check_mpi(post(p->header.data(), kHeaderWords, MPI_INT64_T, dest, kHeaderTag, comm, &p->requests.back()),
            str_cat("MPI_Isend (header to rank ", world_rank(dest), ")"));
  for (at::Tensor& b : p->buffers) {
    for_each_piece(static_cast<uint8_t*>(b.data_ptr()), static_cast<int64_t>(b.nbytes()), [&](uint8_t* data, int count) {
      p->requests.emplace_back();
      check_mpi(post(data, count, MPI_BYTE, dest, kPayloadTag, comm, &p->requests.back()),
                str_cat("MPI_Isend (payload to rank ", world_rank(dest), ")"));
    });
  }
  pending_.push_back(std::move(p));
  return SendHandle{pending_.back()->id};
}

bool Messenger::test(SendHandle handle) {
  FLUX_CHECK(handle.id > 0 && handle.id < next_id_, "unknown send handle ", handle.id);
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p->id == handle.id; });
  if (it == pending_.end()) return true;
  if (!(*it)->test()) return false;
  pending_.erase(it);
  return true;
}

void Messenger::wait(SendHandle handle) {
  FLUX_CHECK(handle.id > 0 && handle.id < next_id_, "unknown send handle ", handle.id);
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p->id == handle.id; });
  if (it == pending_.end()) return;
  (*it)->wait();
  pending_.erase(it);
}

void Messenger::wait_all() { wait_until_at_most(0); }

void Messenger::wait_until_at_most(size_t n) {
  if (pending_.size() <= n) return;
  BlockedTimer timer(blocked_seconds_);
  while (pending_.size() > n) {
    pending_.front()->wait();
    pending_.erase(pending_.begin());
  }
}

size_t Messenger::outstanding() {
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& p) { return p->test(); }), pending_.end());
  return pending_.size();
}

std::vector<at::Tensor> Messenger::recv(int source, const MessageHeader& expected, at::Device device) {
  std::vector<at::Tensor> buffers;
  for (const TensorSpec& t : expected.tensors)
    buffers.push_back(at::empty(t.shape, at::TensorOptions().dtype(t.dtype).device(device)));
  recv_into(source, expected.tag, buffers);
  return buffers;
}

void Messenger::recv_into(int source, const MessageTag& tag, std::vector<at::Tensor>& buffers) {
  for (size_t i = 0; i < buffers.size(); ++i)
    FLUX_CHECK(buffers[i].is_contiguous(), "receive buffer ", i, " of ", message_kind_name(tag.kind), " is not contiguous");
  const MessageHeader expected = MessageHeader::of(tag, buffers);
  const MessageHeader actual = recv_header(source);
  check_header(expected, actual, world_rank(source), world_rank(comm_.rank()));
  recv_payload(source, actual, buffers);
}

std::vector<at::Tensor> Messenger::recv_any_shape(int source, const MessageTag& tag, at::Device device) {
  const MessageHeader actual = recv_header(source);
  // The tag as expected, the tensors as sent.
  MessageHeader expected = actual;
  expected.tag = tag;
  check_header(expected, actual, world_rank(source), world_rank(comm_.rank()));
  std::vector<at::Tensor> buffers;
  for (const TensorSpec& t : actual.tensors)
    buffers.push_back(at::empty(t.shape, at::TensorOptions().dtype(t.dtype).device(device)));
  recv_payload(source, actual, buffers);
  return buffers;
}

MessageHeader Messenger::recv_header(int source) {
  FLUX_CHECK(source >= 0 && source < comm_.size(), "receive from rank ", source, " of ", comm_.size());
  MPI_Comm comm = comm_.handle().comm;
  BlockedTimer timer(blocked_seconds_);

  // The header is where a rank waits for its neighbour, often most of a step: wait without
  // spinning (Open MPI's blocking receive busy-polls a core), so that ranks sharing cores leave
  // them to the ranks that compute. A pause of at most 200 us costs nothing next to a step.
  HeaderWords words{};
  MPI_Request request = MPI_REQUEST_NULL;
  const std::string what = str_cat("MPI_Irecv (header from rank ", world_rank(source), ")");
  check_mpi(MPI_Irecv(words.data(), kHeaderWords, MPI_INT64_T, source, kHeaderTag, comm, &request), what);
  wait_quietly(request, what, MPI_STATUS_IGNORE, idle_);
  return decode_header(words, world_rank(source), world_rank(comm_.rank()));
}

bool Messenger::arrived(int source) const {
  FLUX_CHECK(source >= 0 && source < comm_.size(), "probe rank ", source, " of ", comm_.size());
  int flag = 0;
  check_mpi(MPI_Iprobe(source, kHeaderTag, comm_.handle().comm, &flag, MPI_STATUS_IGNORE),
            str_cat("MPI_Iprobe (header from rank ", world_rank(source), ")"));
  return flag != 0;
}

void Messenger::recv_payload(int source, const MessageHeader& header, std::vector<at::Tensor>& buffers) {
  FLUX_CHECK(buffers.size() == header.tensors.size(), "payload of ", header.describe(), " into ", buffers.size(), " buffers");
  for (size_t i = 0; i < buffers.size(); ++i) {
    FLUX_CHECK(buffers[i].is_contiguous() && buffers[i].scalar_type() == header.tensors[i].dtype &&
                   buffers[i].sizes().vec() == header.tensors[i].shape,
               "receive buffer ", i, " does not fit ", header.describe());
  }
  MPI_Comm comm = comm_.handle().comm;
  BlockedTimer timer(blocked_seconds_);
  for (at::Tensor& b : buffers) {
    at::Tensor target = b;
    if (b.is_cuda()) {
      if (cuda_aware_) synchronize_device(b.device());  // earlier kernels may still use this memory
      else target = at::empty(b.sizes(), at::TensorOptions().dtype(b.scalar_type()).pinned_memory(true));
    }
    for_each_piece(static_cast<uint8_t*>(target.data_ptr()), static_cast<int64_t>(target.nbytes()),
                   [&](uint8_t* data, int count) {
                     check_mpi(MPI_Recv(data, count, MPI_BYTE, source, kPayloadTag, comm, MPI_STATUS_IGNORE),
                               str_cat("MPI_Recv (payload from rank ", world_rank(source), ")"));
                   });
    if (!target.is_same(b)) b.copy_(target);
  }
}

std::optional<Incoming> Messenger::poll_any() {
  MPI_Comm comm = comm_.handle().comm;
  if (!any_) any_ = std::make_unique<AnyReceive>();
  if (any_->request == MPI_REQUEST_NULL)
    check_mpi(MPI_Irecv(any_->words.data(), kHeaderWords, MPI_INT64_T, MPI_ANY_SOURCE, kHeaderTag, comm, &any_->request),
              "MPI_Irecv (header from any rank)");
  int done = 0;
  MPI_Status status;
  check_mpi(MPI_Test(&any_->request, &done, &status), "MPI_Test (header from any rank)");
  if (!done) return std::nullopt;
  Incoming in;
  in.source = status.MPI_SOURCE;
  in.header = decode_header(any_->words, world_rank(in.source), world_rank(comm_.rank()));
  return in;
}

}  // namespace fluxmpi::parallel
