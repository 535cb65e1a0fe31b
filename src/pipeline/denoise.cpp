#include "pipeline/denoise.h"

#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "models/flux/latents.h"

namespace fluxmpi::pipeline {
namespace {

using parallel::MessageKind;
using parallel::MessageTag;

// The message that carries a stream state between ranks: the two streams inside the double
// blocks, the joint stream after them; temb always.
MessageKind kind_of(bool joint) { return joint ? MessageKind::JointStream : MessageKind::DoubleStreams; }

std::vector<at::Tensor> pack_state(const flux::StreamState& s) {
  if (s.is_joint()) return {s.joint.contiguous(), s.temb.contiguous()};
  return {s.txt.contiguous(), s.img.contiguous(), s.temb.contiguous()};
}

class Worker {
 public:
  Worker(const DenoiseSetup& setup, const flux::FluxTransformer& part, const parallel::StagePlan& plan, int rank,
         parallel::Messenger* messenger)
      : setup_(setup), part_(part), plan_(plan), rank_(rank), P_(plan.world_size()), messenger_(messenger) {
    FLUX_CHECK(P_ == 1 || messenger_ != nullptr, "a messenger is needed with ", P_, " ranks");
    const int64_t S = setup.text_tokens;
    rope_ = part->rope(flux::text_position_ids(S).to(setup.device),
                       flux::image_position_ids(setup.latent_height, setup.latent_width).to(setup.device));
    rope_.cos = rope_.cos.to(setup.device);
    rope_.sin = rope_.sin.to(setup.device);
  }

  // Receives the stream state of one unit from the previous rank.
  flux::StreamState receive_state(const WorkGroup& g, int64_t step, int pass) {
    const auto& prev = plan_.blocks(rank_ - 1);
    const bool joint = !prev.ends_in_double();
    const int64_t m = g.count, S = setup_.text_tokens, L = setup_.image_tokens(), D = part_->config().inner_dim();
    auto opts = at::TensorOptions().dtype(setup_.dtype).device(setup_.device);
    std::vector<at::Tensor> buffers;
    if (joint) buffers = {at::empty({m, S + L, D}, opts), at::empty({m, D}, opts)};
    else buffers = {at::empty({m, S, D}, opts), at::empty({m, L, D}, opts), at::empty({m, D}, opts)};
    messenger_->recv_into(rank_ - 1, MessageTag{kind_of(joint), g.first_image, step, pass}, buffers);
    flux::StreamState s;
    s.text_len = S;
    if (joint) {
      s.joint = buffers[0];
      s.temb = buffers[1];
    } else {
      s.txt = buffers[0];
      s.img = buffers[1];
      s.temb = buffers[2];
    }
    return s;
  }

  void send_state(const flux::StreamState& s, const WorkGroup& g, int64_t step, int pass) {
    // A Header fault labels the message with a step the receiver does not expect.
    const int64_t label = setup_.fault.kind == Fault::Kind::Header && setup_.fault.fires(rank_, step) ? step + 1000 : step;
    messenger_->send(rank_ + 1, MessageTag{kind_of(s.is_joint()), g.first_image, label, pass}, pack_state(s));
  }

  at::Tensor receive_noise_pred(const WorkGroup& g, int64_t step, int pass) {
    auto opts = at::TensorOptions().dtype(setup_.dtype).device(setup_.device);
    std::vector<at::Tensor> buffers = {at::empty({g.count, setup_.image_tokens(), part_->config().out_channels}, opts)};
    messenger_->recv_into(P_ - 1, MessageTag{MessageKind::NoisePred, g.first_image, step, pass}, buffers);
    return buffers[0];
  }

  // Ranks 1..P-1: every unit in the order rank 0 sends them.
  void run_downstream() {
    for (int64_t step = 0; step < setup_.steps; ++step) {
      for (const WorkGroup& g : setup_.groups) {
        if (step < g.start_step) continue;
        for (int pass = 0; pass < setup_.passes; ++pass) {
          trigger(setup_.fault, rank_, step);
          flux::StreamState s = receive_state(g, step, pass);
          part_->run_blocks(s, rope_);
          if (rank_ + 1 < P_) {
            send_state(s, g, step, pass);
          } else {
            messenger_->send(0, MessageTag{MessageKind::NoisePred, g.first_image, step, pass}, {part_->final_layer(s).contiguous()});
          }
        }
      }
    }
    messenger_->wait_all();
  }

  // Rank 0: embeds, runs its blocks, and applies the scheduler.
  void run_root(RootState& root) {
    FLUX_CHECK(root.groups.size() == setup_.groups.size(), "one input set per work group");
    for (int64_t step = 0; step < setup_.steps; ++step) {
      for (size_t gi = 0; gi < setup_.groups.size(); ++gi) {
        const WorkGroup& g = setup_.groups[gi];
        if (step < g.start_step) continue;
        // Steady state: this group's previous step is back from the last rank.
        if (P_ > 1 && step > g.start_step) finish_step(root, gi, step - 1, collect(g, step - 1));
        std::vector<at::Tensor> local;
        for (int pass = 0; pass < setup_.passes; ++pass) {
          trigger(setup_.fault, rank_, step);
          flux::StreamState s = part_->embed(inputs(root, gi, step, pass));
          part_->run_blocks(s, rope_);
          if (P_ == 1) local.push_back(part_->final_layer(s));
          else send_state(s, g, step, pass);
        }
        if (P_ == 1) finish_step(root, gi, step, local);
      }
    }
    // Drain: the last step of every group.
    if (P_ > 1) {
      for (size_t gi = 0; gi < setup_.groups.size(); ++gi) {
        const WorkGroup& g = setup_.groups[gi];
        if (g.start_step < setup_.steps) finish_step(root, gi, setup_.steps - 1, collect(g, setup_.steps - 1));
      }
      messenger_->wait_all();
    }
  }

 private:
  std::vector<at::Tensor> collect(const WorkGroup& g, int64_t step) {
    std::vector<at::Tensor> v;
    for (int pass = 0; pass < setup_.passes; ++pass) v.push_back(receive_noise_pred(g, step, pass));
    return v;
  }

  flux::TransformerInputs inputs(const RootState& root, size_t gi, int64_t step, int pass) const {
    const GroupInputs& in = root.groups[gi];
    const int64_t m = setup_.groups[gi].count;
    flux::TransformerInputs t;
    t.latents = in.latents;
    t.text = pass == 0 ? in.text : in.neg_text;
    t.pooled = pass == 0 ? in.pooled : in.neg_pooled;
    // FluxPipeline: t.expand(n).to(latents.dtype), passed as timestep / 1000.
    auto f32 = at::TensorOptions().dtype(at::kFloat).device(setup_.device);
    t.timestep = at::full({m}, root.schedule.timesteps[static_cast<size_t>(step)], f32).to(setup_.dtype) / 1000;
    if (root.guidance) t.guidance = at::full({m}, static_cast<float>(*root.guidance), f32);
    return t;
  }

  void finish_step(RootState& root, size_t gi, int64_t step, const std::vector<at::Tensor>& v_passes) {
    at::Tensor v = v_passes[0];
    // True CFG as FluxPipeline: neg + scale * (cond - neg).
    if (v_passes.size() == 2) v = v_passes[1] + root.true_cfg_scale * (v_passes[0] - v_passes[1]);
    GroupInputs& in = root.groups[gi];
    in.latents = sched::euler_step(in.latents, v, root.schedule.sigmas[static_cast<size_t>(step)],
                                   root.schedule.sigmas[static_cast<size_t>(step) + 1]);
    if (root.observer) root.observer->on_step(setup_.groups[gi], step, in.latents, v);
  }

  const DenoiseSetup& setup_;
  const flux::FluxTransformer& part_;
  const parallel::StagePlan& plan_;
  int rank_, P_;
  parallel::Messenger* messenger_;
  flux::RopeTables rope_;
};

}  // namespace

void denoise(const DenoiseSetup& setup, const flux::FluxTransformer& part, const parallel::StagePlan& plan, int rank,
             parallel::Messenger* messenger, RootState* root) {
  c10::InferenceMode guard;
  Worker worker(setup, part, plan, rank, messenger);
  if (rank == 0) {
    FLUX_CHECK(root != nullptr, "rank 0 needs the root state");
    worker.run_root(*root);
  } else {
    worker.run_downstream();
  }
}

}  // namespace fluxmpi::pipeline
