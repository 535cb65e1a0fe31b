#include "pipeline/denoise.h"

#include <c10/core/InferenceMode.h>

#include "core/error.h"
#include "models/flux/latents.h"
#include "pipeline/kontext.h"

namespace fluxmpi::pipeline {

std::vector<TokenRange> patch_ranges(int64_t rows, int64_t cols, int64_t patches) {
  FLUX_CHECK(patches >= 1 && patches <= rows, patches, " patches of ", rows, " token rows");
  std::vector<TokenRange> out;
  int64_t row = 0;
  for (int64_t p = 0; p < patches; ++p) {
    const int64_t n = rows / patches + (p < rows % patches ? 1 : 0);
    out.push_back({row * cols, n * cols});
    row += n;
  }
  return out;
}

namespace {

using parallel::MessageKind;
using parallel::MessageTag;

// The message that carries a stream state between ranks: the two streams inside the double
// blocks, the joint stream after them; temb always.
MessageKind kind_of(bool joint) { return joint ? MessageKind::JointStream : MessageKind::DoubleStreams; }

// FLUX.2 adds the modulation vectors the embedders computed (flux/stage_model.h).
std::vector<at::Tensor> pack_state(const flux::StreamState& s) {
  std::vector<at::Tensor> out;
  if (s.is_joint()) out = {s.joint.contiguous(), s.temb.contiguous()};
  else out = {s.txt.contiguous(), s.img.contiguous(), s.temb.contiguous()};
  if (s.modulation.defined()) out.push_back(s.modulation.contiguous());
  return out;
}

// One unit of work of a group's step: the whole sequence (an exact step), or one patch.
struct Unit {
  int32_t patch = -1;  // -1: the whole sequence
  int64_t text = 0;    // text tokens it carries: all of them with the whole sequence or patch 0
  TokenRange image;    // its image tokens
  // Where its first token sits in the joint sequence [text; image].
  int64_t offset(int64_t text_tokens) const { return text > 0 ? 0 : text_tokens + image.first; }
  int64_t tokens() const { return text + image.count; }
};

class Worker {
 public:
  Worker(const DenoiseSetup& setup, const flux::StageModel& part, const parallel::StagePlan& plan, int rank,
         parallel::Messenger* messenger)
      : setup_(setup), part_(part), plan_(plan), rank_(rank), P_(plan.world_size()), messenger_(messenger) {
    FLUX_CHECK(P_ == 1 || messenger_ != nullptr, "a messenger is needed with ", P_, " ranks");
    FLUX_CHECK(setup.patches >= 1 && setup.warmup_steps >= 1, "patches ", setup.patches, ", warm-up steps ",
               setup.warmup_steps);
    const int64_t S = setup.text_tokens;
    FLUX_CHECK(setup.patches == 1 || setup.reference_tokens() == 0, "patches with Kontext reference tokens");
    at::Tensor image_ids = part.image_position_ids(setup.latent_height, setup.latent_width);
    if (setup.reference_tokens() > 0)
      image_ids = at::cat({image_ids, reference_position_ids(setup.reference_height, setup.reference_width)}, 0);
    rope_ = part.rope(part.text_position_ids(S).to(setup.device), image_ids.to(setup.device));
    rope_.cos = rope_.cos.to(setup.device);
    rope_.sin = rope_.sin.to(setup.device);
    if (setup.patches > 1) {
      const auto ranges = patch_ranges(setup.latent_height / 2, setup.latent_width / 2, setup.patches);
      for (size_t p = 0; p < ranges.size(); ++p)
        patch_units_.push_back(Unit{static_cast<int32_t>(p), p == 0 ? S : 0, ranges[p]});
    }
    kv_.resize(setup.groups.size());
    step_v_.resize(setup.groups.size());
    for (auto& passes : kv_) passes.resize(static_cast<size_t>(setup.passes));
  }

  // The units of a group's step, in the order they flow.
  std::vector<Unit> units(const WorkGroup& g, int64_t step) const {
    if (setup_.exact_step(g, step)) return {Unit{-1, setup_.text_tokens, TokenRange{0, setup_.image_tokens()}}};
    return patch_units_;
  }

  // Receives the stream state of one unit from the previous rank.
  flux::StreamState receive_state(const WorkGroup& g, int64_t step, int pass, const Unit& u) {
    const auto& prev = plan_.blocks(rank_ - 1);
    const bool joint = !prev.ends_in_double();
    const int64_t m = g.count, S = u.text, D = part_.stream_dim(), M = part_.modulation_dim();
    const int64_t L = u.image.count + (u.patch < 0 ? setup_.reference_tokens() : 0);  // Kontext: + the reference
    auto opts = at::TensorOptions().dtype(setup_.dtype).device(setup_.device);
    std::vector<at::Tensor> buffers;
    if (joint) buffers = {at::empty({m, S + L, D}, opts), at::empty({m, D}, opts)};
    else buffers = {at::empty({m, S, D}, opts), at::empty({m, L, D}, opts), at::empty({m, D}, opts)};
    if (M > 0) buffers.push_back(at::empty({m, M}, opts));
    messenger_->recv_into(rank_ - 1, MessageTag{kind_of(joint), g.first_image, step, pass, u.patch}, buffers);
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
    if (M > 0) s.modulation = buffers.back();
    return s;
  }

  void send_state(const flux::StreamState& s, const WorkGroup& g, int64_t step, int pass, const Unit& u) {
    // A Header fault labels the message with a step the receiver does not expect, a Patch fault
    // (in a pipelined step) with the next patch.
    const bool fire = setup_.fault.fires(rank_, step);
    const int64_t label = fire && setup_.fault.kind == Fault::Kind::Header ? step + 1000 : step;
    const int32_t patch = fire && setup_.fault.kind == Fault::Kind::Patch && u.patch >= 0 ? u.patch + 1 : u.patch;
    messenger_->send(rank_ + 1, MessageTag{kind_of(s.is_joint()), g.first_image, label, pass, patch}, pack_state(s));
  }

  at::Tensor receive_noise_pred(const WorkGroup& g, int64_t step, int pass, const Unit& u) {
    auto opts = at::TensorOptions().dtype(setup_.dtype).device(setup_.device);
    std::vector<at::Tensor> buffers = {at::empty({g.count, u.image.count, part_.output_channels()}, opts)};
    messenger_->recv_into(P_ - 1, MessageTag{MessageKind::NoisePred, g.first_image, step, pass, u.patch}, buffers);
    return buffers[0];
  }

  // Ranks 1..P-1: every unit in the order rank 0 sends them.
  void run_downstream() {
    for (int64_t step = 0; step < setup_.steps; ++step) {
      for (size_t gi = 0; gi < setup_.groups.size(); ++gi) {
        const WorkGroup& g = setup_.groups[gi];
        if (step < g.start_step) continue;
        for (const Unit& u : units(g, step)) {
          for (int pass = 0; pass < setup_.passes; ++pass) {
            trigger(setup_.fault, rank_, step);
            flux::StreamState s = receive_state(g, step, pass, u);
            run_blocks(s, gi, step, pass, u);
            if (rank_ + 1 < P_) {
              send_state(s, g, step, pass, u);
            } else {
              messenger_->send(0, MessageTag{MessageKind::NoisePred, g.first_image, step, pass, u.patch},
                               {noise_prediction(s, u).contiguous()});
            }
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
        const std::vector<Unit> us = units(g, step);
        for (size_t ui = 0; ui < us.size(); ++ui) {
          // Steady state: what this unit needs of the group's previous step is back from the last rank.
          if (P_ > 1 && step > g.start_step) collect_previous(root, gi, step, ui);
          std::vector<at::Tensor> local;
          for (int pass = 0; pass < setup_.passes; ++pass) {
            trigger(setup_.fault, rank_, step);
            flux::StreamState s = part_.embed(inputs(root, gi, step, pass, us[ui]));
            run_blocks(s, gi, step, pass, us[ui]);
            if (P_ == 1) local.push_back(noise_prediction(s, us[ui]));
            else send_state(s, g, step, pass, us[ui]);
          }
          if (P_ == 1) finish_unit(root, gi, step, us[ui], local);
        }
      }
    }
    // Drain: the last step of every group.
    if (P_ > 1) {
      for (size_t gi = 0; gi < setup_.groups.size(); ++gi) {
        const WorkGroup& g = setup_.groups[gi];
        if (g.start_step >= setup_.steps) continue;
        for (const Unit& u : units(g, setup_.steps - 1)) finish_unit(root, gi, setup_.steps - 1, u, collect(g, setup_.steps - 1, u));
      }
      messenger_->wait_all();
    }
  }

 private:
  // Rank 0, before unit `ui` of `step`: the previous step's unit of the same rows when both steps
  // have the same units, else (the first pipelined step after the warm-up) all of it at once.
  void collect_previous(RootState& root, size_t gi, int64_t step, size_t ui) {
    const WorkGroup& g = setup_.groups[gi];
    const std::vector<Unit> prev = units(g, step - 1);
    if (prev.size() == units(g, step).size()) {
      finish_unit(root, gi, step - 1, prev[ui], collect(g, step - 1, prev[ui]));
    } else if (ui == 0) {
      for (const Unit& u : prev) finish_unit(root, gi, step - 1, u, collect(g, step - 1, u));
    }
  }

  // The final layer's output over the unit's image tokens: Kontext's reference tokens are dropped
  // (FluxKontextPipeline keeps noise_pred[:, :L]).
  at::Tensor noise_prediction(const flux::StreamState& s, const Unit& u) const {
    at::Tensor v = part_.final_layer(s);
    return v.size(1) == u.image.count ? v : v.narrow(1, 0, u.image.count);
  }

  std::vector<at::Tensor> collect(const WorkGroup& g, int64_t step, const Unit& u) {
    std::vector<at::Tensor> v;
    for (int pass = 0; pass < setup_.passes; ++pass) v.push_back(receive_noise_pred(g, step, pass, u));
    return v;
  }

  // This rank's blocks on one unit, with the key/value caches when the step is pipelined or the
  // next one will be (an exact step fills them).
  void run_blocks(flux::StreamState& s, size_t gi, int64_t step, int pass, const Unit& u) {
    const WorkGroup& g = setup_.groups[gi];
    const bool pipelined = u.patch >= 0;
    const bool fills = !pipelined && step + 1 < setup_.steps && !setup_.exact_step(g, step + 1);
    if (!pipelined && !fills) {
      part_.run_blocks(s, rope_);
      return;
    }
    std::vector<flux::KvCache>& kv = kv_[gi][static_cast<size_t>(pass)];
    if (kv.empty()) {
      FLUX_CHECK(fills, "patch ", u.patch, " of step ", step, " without a warm-up step before it");
      kv = part_.kv_caches(g.count, setup_.text_tokens + setup_.image_tokens(),
                            at::TensorOptions().dtype(setup_.dtype).device(setup_.device));
    }
    const int64_t offset = u.offset(setup_.text_tokens);
    for (flux::KvCache& c : kv) c.offset = offset;
    flux::RopeTables rope = rope_;
    if (pipelined) rope = {rope_.cos.narrow(0, offset, u.tokens()), rope_.sin.narrow(0, offset, u.tokens())};
    part_.run_blocks(s, rope, {}, &kv);
    // The group's last unit of its last step: its caches are not needed any more.
    if (step == setup_.steps - 1 && u.patch == static_cast<int32_t>(setup_.patches) - 1) kv.clear();
  }

  flux::TransformerInputs inputs(const RootState& root, size_t gi, int64_t step, int pass, const Unit& u) const {
    const GroupInputs& in = root.groups[gi];
    const int64_t m = setup_.groups[gi].count;
    flux::TransformerInputs t;
    t.latents = u.patch < 0 ? in.latents : in.latents.narrow(1, u.image.first, u.image.count).contiguous();
    if (in.reference.defined()) t.latents = at::cat({t.latents, in.reference}, 1);
    if (in.features.defined())
      t.latents = at::cat({t.latents, u.patch < 0 ? in.features : in.features.narrow(1, u.image.first, u.image.count)}, 2);
    t.text = pass == 0 ? in.text : in.neg_text;
    if (u.text == 0) t.text = t.text.narrow(1, 0, 0);  // the text travels with patch 0
    t.pooled = pass == 0 ? in.pooled : in.neg_pooled;
    // FluxPipeline: t.expand(n).to(latents.dtype), passed as timestep / 1000.
    auto f32 = at::TensorOptions().dtype(at::kFloat).device(setup_.device);
    t.timestep = at::full({m}, root.schedule.timesteps[static_cast<size_t>(step)], f32).to(setup_.dtype) / 1000;
    if (root.guidance) t.guidance = at::full({m}, static_cast<float>(*root.guidance), f32);
    return t;
  }

  // Rank 0: the scheduler step of one unit's rows; the observer hears of the step once all of
  // its rows have moved.
  void finish_unit(RootState& root, size_t gi, int64_t step, const Unit& u, const std::vector<at::Tensor>& v_passes) {
    at::Tensor v = v_passes[0];
    // True CFG as FluxPipeline: neg + scale * (cond - neg).
    if (v_passes.size() == 2) v = v_passes[1] + root.true_cfg_scale * (v_passes[0] - v_passes[1]);
    GroupInputs& in = root.groups[gi];
    const float sigma = root.schedule.sigmas[static_cast<size_t>(step)];
    const float sigma_next = root.schedule.sigmas[static_cast<size_t>(step) + 1];
    auto step_rows = [&](const at::Tensor& rows, TokenRange range) {
      at::Tensor x = sched::euler_step(rows, v, sigma, sigma_next);
      return root.after_step ? root.after_step(gi, step, range, x) : x;
    };
    if (u.patch < 0) {
      in.latents = step_rows(in.latents, TokenRange{0, setup_.image_tokens()});
      if (root.observer) root.observer->on_step(setup_.groups[gi], step, in.latents, v);
      return;
    }
    if (u.patch == 0) {
      // Rows are updated in place from here on: the caller's tensors stay untouched.
      in.latents = in.latents.clone();
      step_v_[gi] = at::empty({in.latents.size(0), setup_.image_tokens(), v.size(2)}, v.options());
    }
    at::Tensor rows = in.latents.narrow(1, u.image.first, u.image.count);
    rows.copy_(step_rows(rows, u.image));
    step_v_[gi].narrow(1, u.image.first, u.image.count).copy_(v);
    if (u.patch == static_cast<int32_t>(setup_.patches) - 1 && root.observer)
      root.observer->on_step(setup_.groups[gi], step, in.latents, step_v_[gi]);
  }

  const DenoiseSetup& setup_;
  const flux::StageModel& part_;
  const parallel::StagePlan& plan_;
  int rank_, P_;
  parallel::Messenger* messenger_;
  flux::RopeTables rope_;
  std::vector<Unit> patch_units_;                             // the M patches of a pipelined step
  std::vector<std::vector<std::vector<flux::KvCache>>> kv_;  // [group][pass][block held]
  std::vector<at::Tensor> step_v_;                            // rank 0, per group: v of the pipelined step being finished
};

}  // namespace

void denoise(const DenoiseSetup& setup, const flux::StageModel& part, const parallel::StagePlan& plan, int rank,
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
