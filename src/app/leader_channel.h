#pragma once
/// With several pipelines (`--stages`) world rank 0 stays the only writer of the checkpoint and
/// the PNGs (DESIGN.md §5: serial HDF5, SWMR; no parallel HDF5): the other leaders send it, over
/// the leaders' communicator, every step of their groups (with the latents and noise prediction
/// when the checkpoint keeps the row), their decoded images, and a last "done".
///
/// Back-pressure: a leader's messages are synchronous sends (they complete only once rank 0 has
/// taken them) with at most kRowsInFlight outstanding, so a slow file system holds the leaders
/// back instead of filling rank 0's memory. Rank 0 takes the messages whenever it can: between its
/// own steps, while it waits for its own pipeline, between its decode batches, and at the end
/// until every leader is done. Every message is checked (the group, the step it must be at, the
/// shapes) before its payload is taken.

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <vector>

#include "pipeline/run_plan.h"
#include "io/png.h"
#include "parallel/message.h"
#include "pipeline/denoise.h"

namespace fluxmpi::app {

using pipeline::RunPlan;

/// Messages a leader may have in flight to rank 0.
inline constexpr size_t kRowsInFlight = 8;

/// Whether the checkpoint keeps the row of `step` (counted from the image's start in the full
/// schedule t0) of any image of `group`, with --checkpoint-every `every`.
bool group_keeps_row(const pipeline::WorkGroup& group, int64_t step, const std::vector<int64_t>& t_start, int64_t steps,
                     int64_t every);

/// A pipeline leader other than world rank 0.
class RowSender : public pipeline::DenoiseObserver {
 public:
  /// `leaders`: the leaders' communicator (rank 0 is the writer).
  RowSender(const parallel::Communicator& leaders, const RunPlan& plan, std::vector<int64_t> t_start);
  void on_step(const pipeline::WorkGroup& group, int64_t step, const at::Tensor& latents, const at::Tensor& v) override;
  void send_image(int64_t image, const io::RgbImage& pixels);
  /// The last message; waits until rank 0 has taken everything.
  void finish();

 private:
  const RunPlan& plan_;
  std::vector<int64_t> t_start_;
  parallel::Messenger messenger_;
};

/// World rank 0's side.
class LeaderInbox {
 public:
  struct Handlers {
    /// A step of a group another leader runs: latents and v [m, L, C] when the row is kept, else
    /// undefined.
    std::function<void(const pipeline::WorkGroup&, int64_t step, const at::Tensor& latents, const at::Tensor& v)> step;
    std::function<void(int64_t image, const io::RgbImage& pixels)> image;
  };
  LeaderInbox(const parallel::Communicator& leaders, const RunPlan& plan, std::vector<int64_t> t_start, Handlers handlers);
  /// Handles every message that has arrived; never waits for one.
  void poll();
  /// Handles messages until every other leader is done.
  void serve_until_done();
  /// The leaders that are not done yet.
  int pending_leaders() const { return pending_; }

 private:
  void handle(int source, const parallel::MessageHeader& header);

  const RunPlan& plan_;
  std::vector<int64_t> t_start_;
  Handlers handlers_;
  parallel::Messenger messenger_;
  std::map<int64_t, size_t> group_of_;  // first image -> group
  std::vector<int64_t> next_step_;      // per group: the step it must report next
  std::vector<char> decoded_;           // per image
  int pending_;
};

}  // namespace fluxmpi::app
