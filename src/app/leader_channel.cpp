#include "app/leader_channel.h"

#include <chrono>
#include <thread>

#include "app/prepare.h"
#include "core/error.h"

namespace fluxmpi::app {
namespace {

using parallel::MessageHeader;
using parallel::MessageKind;
using parallel::MessageTag;

at::Tensor nothing() { return at::empty({0}, at::kFloat); }

}  // namespace

bool group_keeps_row(const pipeline::WorkGroup& group, int64_t step, const std::vector<int64_t>& t_start, int64_t steps,
                     int64_t every) {
  for (int64_t j = 0; j < group.count; ++j) {
    const int64_t t0 = t_start[static_cast<size_t>(group.first_image + j)];
    if (keep_row(step - t0, steps - t0, every)) return true;
  }
  return false;
}

RowSender::RowSender(const parallel::Communicator& leaders, const RunPlan& plan, std::vector<int64_t> t_start)
    : plan_(plan), t_start_(std::move(t_start)), messenger_(leaders, kRowsInFlight, parallel::SendMode::Synchronous) {}

void RowSender::on_step(const pipeline::WorkGroup& group, int64_t step, const at::Tensor& latents, const at::Tensor& v) {
  const MessageTag tag{MessageKind::StepRow, group.first_image, step, 0, -1};
  // Rows travel as float32, what the checkpoint stores (exact for bf16 and fp16), in copies of
  // their own: MPI reads them until rank 0 has taken them, while the loop goes on.
  auto copy = [](const at::Tensor& t) { return t.to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous(); };
  if (plan_.checkpoint && group_keeps_row(group, step, t_start_, plan_.steps, plan_.checkpoint_every))
    messenger_.send(0, tag, {copy(latents), copy(v)});
  else
    messenger_.send(0, tag, {nothing()});
}

void RowSender::send_image(int64_t image, const io::RgbImage& pixels) {
  at::Tensor t = at::empty({pixels.height, pixels.width, 3}, at::kByte);
  std::copy(pixels.pixels.begin(), pixels.pixels.end(), t.data_ptr<uint8_t>());
  messenger_.send(0, MessageTag{MessageKind::ImagePixels, image, 0, 0, -1}, {t});
}

void RowSender::finish() {
  messenger_.send(0, MessageTag{MessageKind::LeaderDone, -1, -1, 0, -1}, {nothing()});
  messenger_.wait_all();
}

LeaderInbox::LeaderInbox(const parallel::Communicator& leaders, const RunPlan& plan, std::vector<int64_t> t_start,
                         Handlers handlers)
    : plan_(plan),
      t_start_(std::move(t_start)),
      handlers_(std::move(handlers)),
      messenger_(leaders),
      decoded_(t_start_.size(), 0),
      pending_(leaders.size() - 1) {
  FLUX_CHECK(leaders.rank() == 0, "the leaders' inbox is world rank 0's");
  for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
    group_of_[plan.groups[gi].first_image] = gi;
    next_step_.push_back(plan.groups[gi].start_step);
  }
}

void LeaderInbox::poll() {
  while (pending_ > 0) {
    std::optional<parallel::Incoming> in = messenger_.poll_any();
    if (!in) return;
    handle(in->source, in->header);
  }
}

void LeaderInbox::serve_until_done() {
  for (int64_t pause_us = 1; pending_ > 0;) {
    std::optional<parallel::Incoming> in = messenger_.poll_any();
    if (in) {
      handle(in->source, in->header);
      pause_us = 1;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    pause_us = std::min<int64_t>(2 * pause_us, 200);
  }
}

void LeaderInbox::handle(int source, const MessageHeader& header) {
  const int from = messenger_.world_rank(source);
  auto refuse = [&](const std::string& why) {
    return CommError(str_cat("rank 0 received ", header.describe(), " from rank ", from, ": ", why));
  };
  auto expect = [&](const MessageTag& tag, const std::vector<at::Tensor>& buffers) {
    parallel::check_header(MessageHeader::of(tag, buffers), header, from, 0);
  };
  const MessageTag& tag = header.tag;
  if (tag.kind == MessageKind::StepRow) {
    auto it = group_of_.find(tag.image);
    if (it == group_of_.end()) throw refuse("no work group of this job starts at that image");
    const size_t gi = it->second;
    const pipeline::WorkGroup& g = plan_.groups[gi];
    const int64_t step = next_step_[gi];
    if (step >= plan_.steps) throw refuse("that group's last step is done");
    std::vector<at::Tensor> buffers;
    const bool rows = plan_.checkpoint && group_keeps_row(g, step, t_start_, plan_.steps, plan_.checkpoint_every);
    if (rows) {
      const flux::LatentGeometry& geo = plan_.geometry;
      for (int k = 0; k < 2; ++k) buffers.push_back(at::empty({g.count, geo.tokens(), geo.token_dim()}, at::kFloat));
    } else {
      buffers.push_back(nothing());
    }
    expect(MessageTag{MessageKind::StepRow, g.first_image, step, 0, -1}, buffers);
    messenger_.recv_payload(source, header, buffers);
    ++next_step_[gi];
    handlers_.step(g, step, rows ? buffers[0] : at::Tensor(), rows ? buffers[1] : at::Tensor());
    return;
  }
  if (tag.kind == MessageKind::ImagePixels) {
    const int64_t n = static_cast<int64_t>(decoded_.size());
    if (tag.image < 0 || tag.image >= n) throw refuse(str_cat("the job has images 0 to ", n - 1));
    if (decoded_[static_cast<size_t>(tag.image)]) throw refuse("that image was received before");
    std::vector<at::Tensor> buffers = {at::empty({plan_.geometry.height, plan_.geometry.width, 3}, at::kByte)};
    expect(MessageTag{MessageKind::ImagePixels, tag.image, 0, 0, -1}, buffers);
    messenger_.recv_payload(source, header, buffers);
    decoded_[static_cast<size_t>(tag.image)] = 1;
    io::RgbImage pixels;
    pixels.height = plan_.geometry.height;
    pixels.width = plan_.geometry.width;
    const uint8_t* p = buffers[0].data_ptr<uint8_t>();
    pixels.pixels.assign(p, p + buffers[0].numel());
    handlers_.image(tag.image, pixels);
    return;
  }
  if (tag.kind == MessageKind::LeaderDone) {
    std::vector<at::Tensor> buffers = {nothing()};
    expect(MessageTag{MessageKind::LeaderDone, -1, -1, 0, -1}, buffers);
    messenger_.recv_payload(source, header, buffers);
    --pending_;
    return;
  }
  throw refuse("a leader sends rank 0 only StepRow, ImagePixels and LeaderDone");
}

}  // namespace fluxmpi::app
