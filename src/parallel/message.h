#pragma once
/// Typed tensor messages between ranks (DESIGN.md §3). Every message is a fixed-size header
/// (kind, image, step, pass, patch, and dtype + shape of each tensor) followed by the tensors' bytes.
/// The receiver states what it expects; a header that differs is a CommError naming sender,
/// receiver, expected and actual. Sends are non-blocking (MPI_Isend, buffers kept alive until
/// completion, with wait/test to bound what is in flight); receives block (MPI_Recv).
///
/// CUDA tensors travel directly when the MPI is CUDA-aware, else through pinned host copies
/// (Debian's Open MPI is not CUDA-aware).

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/mpi_env.h"

namespace fluxmpi::parallel {

/// What travels, in the order of one denoising step.
enum class MessageKind : int32_t {
  /// Into a slice that starts with a double block: txt [m, L_txt, D], img [m, L_img, D], temb [m, D].
  DoubleStreams = 1,
  /// Into a slice of single blocks: the joint stream [m, L_txt + L_img, D] and temb [m, D].
  JointStream = 2,
  /// The last rank's output back to rank 0: the noise prediction [m, L_img, 4C].
  NoisePred = 3,
  /// FLUX.2's text encoder split over ranks (pipeline/text_split.h), to the next slice: one
  /// prompt's hidden states [B, S, H] and its attention mask [B, S] (fp32 0/1).
  TextHidden = 4,
  /// From a slice after the first back to rank 0: the requested hidden states it produced,
  /// stacked [n, B, S, H] in ascending layer order.
  TextStates = 5,
  /// The tiled decode spread over a pipeline (pipeline/tile_decode.h), from the leader to a
  /// helper: one pass's VAE input [B, latent_channels, h, w] (B = 0: no more passes).
  DecodeLatents = 6,
  /// Back to the leader: one decoded tile [B, out_channels, th * s, tw * s] (step = the tile).
  DecodedTile = 7,
  /// A pipeline leader to the next rank of its pipeline, passed on to the last: no more work
  /// (`--stages`, dynamic hand-out; an empty [0] tensor).
  End = 8,
  /// A pipeline leader to world rank 0, the checkpoint writer (pipeline/leader_channel.h): a
  /// group's step, with its latents and noise prediction [m, L_img, C] when the row is stored (else
  /// an empty [0] tensor).
  StepRow = 9,
  /// A pipeline leader to world rank 0: one decoded image, uint8 [H, W, 3].
  ImagePixels = 10,
  /// A pipeline leader to world rank 0: all of its rows and images are sent (an empty [0] tensor).
  LeaderDone = 11,
  /// A pipeline's rank 0, which runs the ControlNets, to a rank whose blocks add their residuals
  /// (pipeline/denoise.h), posted right after the unit's first stream message: the samples that
  /// rank's blocks add, stacked [k, m, L_unit, D] (pass 0; both passes of true CFG use them).
  ControlResiduals = 12,
};
/// "DoubleStreams" | "JointStream" | "NoisePred" | "TextHidden" | "TextStates" | "DecodeLatents" |
/// "DecodedTile" | "End" | "StepRow" | "ImagePixels" | "LeaderDone" | "ControlResiduals"
const char* message_kind_name(MessageKind kind);

/// Which image, step and pass a message belongs to.
struct MessageTag {
  MessageKind kind = MessageKind::DoubleStreams;
  int64_t image = 0;  ///< job-wide image index (of the first image of the microbatch)
  int64_t step = 0;
  int32_t pass = 0;   ///< 0 = conditional, 1 = negative prompt (true CFG)
  int32_t patch = -1; ///< patch pipelining: the patch of the step (0..M-1); -1 = the whole sequence
};

struct TensorSpec {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t nbytes() const;
};

struct MessageHeader {
  MessageTag tag;
  std::vector<TensorSpec> tensors;

  /// The header that describes sending `tensors` under `tag`.
  static MessageHeader of(const MessageTag& tag, const std::vector<at::Tensor>& tensors);
  /// "JointStream(image 3, step 5, pass 0, bf16 [1, 4608, 3072], bf16 [1, 3072])"; a patch's
  /// message names it after the pass: "JointStream(image 3, step 5, pass 0, patch 2, ...)".
  std::string describe() const;
  bool operator==(const MessageHeader& other) const;
  bool operator!=(const MessageHeader& other) const { return !(*this == other); }
};

/// Limits of the fixed header.
inline constexpr int kMaxMessageTensors = 8;
inline constexpr int kMaxTensorDims = 6;
/// Header layout, in int64 words: magic, version, kind, image, step, pass, count, then per
/// tensor dtype, rank (number of dims) and kMaxTensorDims sizes, then the patch (version 2).
inline constexpr int kHeaderWords = 7 + kMaxMessageTensors * (2 + kMaxTensorDims) + 1;
inline constexpr int kHeaderPatchWord = kHeaderWords - 1;
using HeaderWords = std::array<int64_t, kHeaderWords>;

/// The wire form of a header. InternalError for a header fluxmpi must never send (more tensors
/// or dimensions than the limits, a dtype other than fp32/bf16/fp16/uint8).
HeaderWords encode_header(const MessageHeader& header);
/// Reads a received header. CommError "rank <receiver> received a malformed message header from
/// rank <sender>: ..." for anything encode_header cannot produce.
MessageHeader decode_header(const HeaderWords& words, int sender, int receiver);
/// CommError unless `actual` equals `expected`:
/// "rank 1 expected JointStream(...) from rank 0, got NoisePred(...)".
void check_header(const MessageHeader& expected, const MessageHeader& actual, int sender, int receiver);

/// Identifies one posted send.
struct SendHandle {
  uint64_t id = 0;
};

/// A header received from any member (Messenger::poll_any).
struct Incoming {
  int source = 0;  ///< the sender's rank in the messenger's communicator
  MessageHeader header;
};

/// How sends complete.
enum class SendMode {
  /// MPI_Isend: small messages may complete before the receiver asked for them (eager).
  Standard,
  /// MPI_Issend: a send completes only once the receiver has matched it, so that `max_outstanding`
  /// bounds what is in flight end to end (the leaders' rows to the checkpoint writer: a slow file
  /// system holds the senders back instead of filling the writer's memory).
  Synchronous,
};

/// Point-to-point messages of one rank within one communicator (ranks are the communicator's;
/// errors name world ranks). Calls come from the thread that created the MpiEnv.
class Messenger {
 public:
  /// `max_outstanding` > 0: send() first waits for the oldest sends until fewer than that many
  /// are in flight (bounds the memory held by buffers). 0: no bound.
  explicit Messenger(const Communicator& comm, size_t max_outstanding = 0, SendMode mode = SendMode::Standard);
  /// Over every rank of the job.
  explicit Messenger(const MpiEnv& env, size_t max_outstanding = 0);
  /// Waits for the outstanding sends. While an exception unwinds, abandons them instead (the job
  /// is about to abort; their buffers are deliberately not freed under a pending MPI request).
  ~Messenger();
  Messenger(const Messenger&) = delete;
  Messenger& operator=(const Messenger&) = delete;

  /// Posts the header and the tensors' bytes to rank `dest` and returns without waiting for the
  /// receiver. Tensors: contiguous, fp32/bf16/fp16, on the CPU or a CUDA device; they (or their
  /// pinned host copies, made before this returns) stay referenced until the send completes, so
  /// the caller may drop its own references — but must not write into them before test() or
  /// wait() says the send is complete (MPI reads them in the meantime).
  SendHandle send(int dest, const MessageTag& tag, std::vector<at::Tensor> tensors);
  /// True when that send has completed (never blocks).
  bool test(SendHandle handle);
  /// Blocks until that send has completed.
  void wait(SendHandle handle);
  /// Blocks until every send has completed.
  void wait_all();
  /// Blocks until at most `n` sends are in flight, completing the oldest first.
  void wait_until_at_most(size_t n);
  /// Sends in flight (completed ones are reaped first).
  size_t outstanding();

  /// Receives the next message from `source` (blocking): its header must equal `expected`; the
  /// tensors are allocated contiguous on `device`.
  std::vector<at::Tensor> recv(int source, const MessageHeader& expected, at::Device device);
  /// Receives the next message from `source` (blocking) whose tag must equal `tag` but whose
  /// dtypes and shapes the sender chose (the caller checks them): for a receiver that cannot know
  /// the sizes beforehand, as a decode helper learns each pass's batch from its latents.
  std::vector<at::Tensor> recv_any_shape(int source, const MessageTag& tag, at::Device device);
  /// Receives into caller-owned contiguous buffers, reused across steps; their dtypes and shapes
  /// together with `tag` are the expected header.
  void recv_into(int source, const MessageTag& tag, std::vector<at::Tensor>& buffers);

  /// The two halves of a receive, for a receiver that learns from the header what comes (a
  /// pipeline rank under dynamic hand-out, the checkpoint writer): the next header from `source`
  /// (blocking, sleeping between polls), then its tensors into buffers of the header's dtypes and
  /// shapes (contiguous; InternalError otherwise). The caller checks the header before it takes
  /// the payload.
  MessageHeader recv_header(int source);
  /// Whether the next message from `source` has arrived (never blocks; receives nothing). Only
  /// between receives from `source`: a pending recv_header would take the message first.
  bool arrived(int source) const;
  void recv_payload(int source, const MessageHeader& header, std::vector<at::Tensor>& buffers);
  /// A header from any member, if one has arrived (never blocks); its payload must be taken with
  /// recv_payload before the next poll. Keeps one receive posted between calls.
  std::optional<Incoming> poll_any();

  /// Called while a receive waits for its header (between polls): rank 0 serves the other
  /// leaders' rows while it waits for its own pipeline. Must not use this messenger.
  void set_idle(std::function<void()> idle) { idle_ = std::move(idle); }

  /// The world rank of member `rank` of the messenger's communicator.
  int world_rank(int rank) const { return comm_.world_rank(rank); }

  /// Whether CUDA tensors go to MPI directly (MPIX_Query_cuda_support).
  bool cuda_aware() const { return cuda_aware_; }

  /// Seconds this rank has spent blocked in receives and in waits for its sends: the pipeline's
  /// bubbles and transfer time as this rank sees them.
  double blocked_seconds() const { return blocked_seconds_; }

 private:
  struct Pending;
  struct AnyReceive;
  const Communicator& comm_;
  size_t max_outstanding_;
  SendMode mode_;
  std::function<void()> idle_;
  std::unique_ptr<AnyReceive> any_;
  bool cuda_aware_ = false;
  uint64_t next_id_ = 1;
  int uncaught_at_start_ = 0;
  std::vector<std::unique_ptr<Pending>> pending_;  ///< in posting order
  double blocked_seconds_ = 0;
};

}  // namespace fluxmpi::parallel
