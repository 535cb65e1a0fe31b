#include "pipeline/denoise.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"

namespace fluxmpi::pipeline {

std::vector<TokenRange> patch_ranges(int64_t rows, int64_t cols, int64_t patches, int64_t text) {
  FLUX_CHECK(patches >= 1 && patches <= rows && cols >= 1 && text >= 0, patches, " patches of ", rows, " token rows of ",
             cols, " (", text, " text tokens)");
  std::vector<TokenRange> out;
  const int64_t total = rows * cols + text;
  int64_t row = 0;
  for (int64_t p = 0; p < patches; ++p) {
    // The image tokens before the cut, (p + 1) total / patches - text, in rows: the nearest whole
    // row, in integers (ties up); then at least one row for this patch and for each later one.
    const int64_t image = std::max<int64_t>(0, (p + 1) * total - patches * text);  // times `patches`
    int64_t end = (2 * image + patches * cols) / (2 * patches * cols);
    end = p + 1 == patches ? rows : std::clamp(end, row + 1, rows - (patches - 1 - p));
    out.push_back({row * cols, (end - row) * cols});
    row = end;
  }
  return out;
}

std::vector<int64_t> ControlRouting::samples_of(int64_t first, int64_t last) const {
  std::vector<int64_t> out;
  for (int64_t b = first; b <= last && b < static_cast<int64_t>(sample_of_block.size()); ++b)
    if (sample_of_block[b] >= 0 && std::find(out.begin(), out.end(), sample_of_block[b]) == out.end())
      out.push_back(sample_of_block[b]);
  std::sort(out.begin(), out.end());
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
  int32_t patch = -1;     // -1: the whole sequence
  int64_t text = 0;       // text tokens it carries: all of them with the whole sequence or patch 0
  TokenRange image;       // its image tokens
  int64_t reference = 0;  // reference tokens it carries (after its image tokens): as the text
  // Where its first token sits in the joint sequence [text; image; references].
  int64_t offset(int64_t text_tokens) const { return text > 0 ? 0 : text_tokens + image.first; }
  int64_t tokens() const { return text + image.count + reference; }
};

class Worker {
 public:
  Worker(const DenoiseSetup& setup, const flux::StageModel& part, const parallel::StagePlan& plan, int rank,
         parallel::Messenger* messenger)
      : setup_(setup),
        part_(part),
        plan_(plan),
        rank_(rank),
        P_(plan.world_size()),
        fault_rank_(setup.first_world_rank + rank),
        messenger_(messenger) {
    FLUX_CHECK(P_ == 1 || messenger_ != nullptr, "a messenger is needed with ", P_, " ranks");
    FLUX_CHECK(setup.patches >= 1 && setup.warmup_steps >= 1, "patches ", setup.patches, ", warm-up steps ",
               setup.warmup_steps);
    const int64_t S = setup.text_tokens, R = setup.reference_tokens();
    std::vector<at::Tensor> image_ids = {part.image_position_ids(setup.latent_height, setup.latent_width)};
    for (size_t k = 0; k < setup.references.size(); ++k)
      image_ids.push_back(part.reference_position_ids(static_cast<int64_t>(k), setup.references[k].height,
                                                      setup.references[k].width));
    rope_ = part.rope(part.text_position_ids(S).to(setup.device), at::cat(image_ids, 0).to(setup.device));
    rope_.cos = rope_.cos.to(setup.device);
    rope_.sin = rope_.sin.to(setup.device);
    if (setup.patches > 1) {
      // Patch 0 carries the text and the reference tokens: the cut balances them too.
      const auto ranges = patch_ranges(setup.latent_height / 2, setup.latent_width / 2, setup.patches, S + R);
      for (size_t p = 0; p < ranges.size(); ++p) {
        patch_units_.push_back(Unit{static_cast<int32_t>(p), p == 0 ? S : 0, ranges[p], p == 0 ? R : 0});
        // A patch's rows of the sequence: its text and image tokens from its offset on, its
        // reference tokens (patch 0) the sequence's last rows (flux::KvCache::tail).
        const Unit& u = patch_units_.back();
        auto rows = [&](const at::Tensor& t) {
          const at::Tensor head = t.narrow(0, u.offset(S), u.tokens() - u.reference);
          return u.reference == 0 ? head : at::cat({head, t.narrow(0, t.size(0) - u.reference, u.reference)}, 0);
        };
        patch_rope_.push_back({rows(rope_.cos), rows(rope_.sin)});
      }
    }
    kv_.resize(setup.groups.size());
    step_v_.resize(setup.groups.size());
    for (auto& passes : kv_) passes.resize(static_cast<size_t>(setup.passes));
    if (setup.control.enabled()) {
      FLUX_CHECK(static_cast<int64_t>(setup.control.sample_of_block.size()) == plan.num_blocks() &&
                     static_cast<int64_t>(setup.control.active_steps.size()) == setup.steps,
                 "ControlNet routing for ", setup.control.sample_of_block.size(), " blocks and ",
                 setup.control.active_steps.size(), " steps, the job has ", plan.num_blocks(), " and ", setup.steps);
      for (int r = 0; r < P_; ++r) samples_of_rank_.push_back(setup.control.samples_of(plan.blocks(r).first, plan.blocks(r).last));
    }
  }

  // The units of a group's step, in the order they flow.
  std::vector<Unit> units(const WorkGroup& g, int64_t step) const {
    if (setup_.exact_step(g, step))
      return {Unit{-1, setup_.text_tokens, TokenRange{0, setup_.image_tokens()}, setup_.reference_tokens()}};
    return patch_units_;
  }

  // The buffers of one unit's stream state as the previous rank sends it.
  std::vector<at::Tensor> state_buffers(const WorkGroup& g, const Unit& u) const {
    const bool joint = receives_joint();
    const int64_t m = g.count, S = u.text, D = part_.stream_dim(), M = part_.modulation_dim();
    const int64_t L = u.image.count + u.reference;
    auto opts = at::TensorOptions().dtype(setup_.dtype).device(setup_.device);
    std::vector<at::Tensor> buffers;
    if (joint) buffers = {at::empty({m, S + L, D}, opts), at::empty({m, D}, opts)};
    else buffers = {at::empty({m, S, D}, opts), at::empty({m, L, D}, opts), at::empty({m, D}, opts)};
    if (M > 0) buffers.push_back(at::empty({m, M}, opts));
    return buffers;
  }
  bool receives_joint() const { return !plan_.blocks(rank_ - 1).ends_in_double(); }

  flux::StreamState state_of(std::vector<at::Tensor>& buffers, const Unit& u) const {
    flux::StreamState s;
    s.text_len = u.text;
    if (receives_joint()) {
      s.joint = buffers[0];
      s.temb = buffers[1];
    } else {
      s.txt = buffers[0];
      s.img = buffers[1];
      s.temb = buffers[2];
    }
    if (part_.modulation_dim() > 0) s.modulation = buffers.back();
    return s;
  }

  void send_state(const flux::StreamState& s, const WorkGroup& g, int64_t step, int pass, const Unit& u) {
    // A Header fault labels the message with a step the receiver does not expect, a Patch fault
    // (in a pipelined step) with the next patch.
    const bool fire = setup_.fault.fires(fault_rank_, step);
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

  // Ranks 1..S-1: the units in the order they arrive, until the End marker. Each group's units
  // must come in their own order (its steps, within a step its units, within a unit its passes):
  // the header is checked against the group's next unit.
  void run_downstream() {
    struct Cursor {
      int64_t step = 0;
      size_t unit = 0;
      int pass = 0;
    };
    std::vector<Cursor> next(setup_.groups.size());
    std::map<int64_t, size_t> group_of;  // first image -> group
    for (size_t gi = 0; gi < setup_.groups.size(); ++gi) {
      next[gi].step = setup_.groups[gi].start_step;
      group_of[setup_.groups[gi].first_image] = gi;
    }
    const int from = rank_ - 1;
    if (setup_.warm_up_while_waiting) warm_up(from);
    for (;;) {
      const parallel::MessageHeader header = messenger_->recv_header(from);
      if (header.tag.kind == MessageKind::End) {
        std::vector<at::Tensor> none = {end_marker()};
        check_header(parallel::MessageHeader::of(end_tag(), none), header, from);
        messenger_->recv_payload(from, header, none);
        if (rank_ + 1 < P_) messenger_->send(rank_ + 1, end_tag(), {end_marker()});
        break;
      }
      auto it = group_of.find(header.tag.image);
      if (it == group_of.end() || next[it->second].step >= setup_.steps)
        throw CommError(str_cat("rank ", world_rank(rank_), " received ", header.describe(), " from rank ", world_rank(from), ": ",
                                it == group_of.end() ? "no work group of this job starts at that image"
                                                     : "that group's last step is done"));
      const size_t gi = it->second;
      const WorkGroup& g = setup_.groups[gi];
      Cursor& c = next[gi];
      const std::vector<Unit> us = units(g, c.step);
      const Unit& u = us[c.unit];
      trigger(setup_.fault, fault_rank_, c.step);
      std::vector<at::Tensor> buffers = state_buffers(g, u);
      check_header(parallel::MessageHeader::of(MessageTag{kind_of(receives_joint()), g.first_image, c.step, c.pass, u.patch}, buffers),
                   header, from);
      messenger_->recv_payload(from, header, buffers);
      flux::StreamState s = state_of(buffers, u);
      const bool control = setup_.control.active(c.step);
      if (control && c.pass == 0) receive_residuals(g, c.step, u);
      run_blocks(s, gi, c.step, c.pass, u, control);
      if (rank_ + 1 < P_) {
        send_state(s, g, c.step, c.pass, u);
      } else {
        messenger_->send(0, MessageTag{MessageKind::NoisePred, g.first_image, c.step, c.pass, u.patch},
                         {noise_prediction(s, u).contiguous()});
      }
      if (++c.pass == setup_.passes) {
        c.pass = 0;
        if (++c.unit == us.size()) {
          c.unit = 0;
          ++c.step;
        }
      }
    }
    messenger_->wait_all();
  }

  // Ranks 1..S-1, before their first message: this rank's blocks once, on zeros shaped like the
  // first unit it will receive (an exact step: every group starts with one), the result dropped
  // and no cache written. What a first call costs on top of a step (the activations' first pages,
  // the kernels' first calls; on a GPU its libraries' set-up) is then paid while rank 0 loads,
  // encodes and runs its part of that exact step, instead of after it, where rank 0 would wait
  // for it (docs/performance.md, "The warm-up step's first-call costs"). It stops after the block
  // during which the first message arrives.
  void warm_up(int from) {
    struct Arrived {};
    const auto first = std::find_if(setup_.groups.begin(), setup_.groups.end(),
                                    [&](const WorkGroup& w) { return w.start_step < setup_.steps; });
    if (first == setup_.groups.end()) return;  // a resumed job with no step left
    const WorkGroup& g = *first;
    const Unit u = units(g, g.start_step).front();  // the whole sequence: a group's first step is exact
    if (messenger_->arrived(from)) return;
    std::vector<at::Tensor> buffers = state_buffers(g, u);
    for (at::Tensor& b : buffers) b.zero_();
    flux::StreamState s = state_of(buffers, u);
    int64_t blocks = 0;
    bool stopped = false;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      part_.run_blocks(s, rope_, [&](const std::string&, const flux::StreamState&) {
        ++blocks;
        if (messenger_->arrived(from)) throw Arrived{};
      });
    } catch (const Arrived&) {
      stopped = true;
    }
    log::debug("ran ", blocks, " block(s) on zeros while waiting for the first message",
               stopped ? ", stopped when it came" : "", " (",
               std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 100) / 100, " s)");
  }

  // Rank 0: embeds, runs its blocks, and applies the scheduler; the groups in flight are visited
  // round robin, each visit running one step of the group (see denoise.h).
  void run_root(RootState& root) {
    FLUX_CHECK(root.groups.size() == setup_.groups.size(), "one input set per work group");
    struct Active {
      size_t group;
      int64_t step;  // the next step to run; == steps: the last one is on its way back
    };
    std::vector<Active> active;
    size_t handed = 0;  // without a source: the groups in order
    auto take = [&]() -> std::optional<size_t> {
      if (root.source != nullptr) return root.source->next();
      if (handed < setup_.groups.size()) return handed++;
      return std::nullopt;
    };
    const size_t slots = root.slots > 0 ? root.slots : setup_.groups.size();
    auto refill = [&] {
      while (active.size() < slots) {
        const std::optional<size_t> gi = take();
        if (!gi) break;
        FLUX_CHECK(*gi < setup_.groups.size(), "work group ", *gi, " of ", setup_.groups.size());
        active.push_back({*gi, setup_.groups[*gi].start_step});
      }
    };
    // Fill: the first `slots` groups; steady state: one step of each group in flight per round;
    // drain: a group's last step comes back at its next visit, and a new group takes its slot.
    refill();
    while (!active.empty()) {
      for (size_t a = 0; a < active.size();) {
        const size_t gi = active[a].group;
        const int64_t step = active[a].step;
        if (step == setup_.steps) {
          if (P_ > 1)
            for (const Unit& u : units(setup_.groups[gi], step - 1)) finish_unit(root, gi, step - 1, u, collect(setup_.groups[gi], step - 1, u));
          active.erase(active.begin() + static_cast<std::ptrdiff_t>(a));
          if (root.on_group_done) root.on_group_done(gi);
          refill();
          continue;
        }
        run_step(root, gi, step);
        ++active[a].step;
        ++a;
      }
    }
    if (P_ > 1) {
      messenger_->send(1, end_tag(), {end_marker()});
      messenger_->wait_all();
    }
  }

  // Rank 0: one step of a group, unit by unit.
  void run_step(RootState& root, size_t gi, int64_t step) {
    const WorkGroup& g = setup_.groups[gi];
    const std::vector<Unit> us = units(g, step);
    for (size_t ui = 0; ui < us.size(); ++ui) {
      // Steady state: what this unit needs of the group's previous step is back from the last rank.
      if (P_ > 1 && step > g.start_step) collect_previous(root, gi, step, ui);
      // ControlNets: the unit's residual samples, from its conditional inputs.
      const bool control = setup_.control.active(step);
      std::vector<at::Tensor> samples;
      if (control) {
        FLUX_CHECK(root.control != nullptr, "ControlNet routing without a ControlNet source on rank 0");
        samples = root.control->samples(request(gi, step, us[ui]), inputs(root, gi, step, 0, us[ui]));
        set_residuals(samples);
      }
      std::vector<at::Tensor> local;
      for (int pass = 0; pass < setup_.passes; ++pass) {
        trigger(setup_.fault, fault_rank_, step);
        flux::StreamState s = part_.embed(inputs(root, gi, step, pass, us[ui]));
        run_blocks(s, gi, step, pass, us[ui], control);
        if (P_ == 1) {
          local.push_back(noise_prediction(s, us[ui]));
        } else {
          send_state(s, g, step, pass, us[ui]);
          if (control && pass == 0) send_residuals(samples, g, step, us[ui]);
        }
      }
      if (P_ == 1) finish_unit(root, gi, step, us[ui], local);
    }
  }

 private:
  static MessageTag end_tag() { return MessageTag{MessageKind::End, -1, -1, 0, -1}; }
  static at::Tensor end_marker() { return at::empty({0}, at::kFloat); }
  int world_rank(int rank) const { return setup_.first_world_rank + rank; }
  void check_header(const parallel::MessageHeader& expected, const parallel::MessageHeader& actual, int from) const {
    parallel::check_header(expected, actual, world_rank(from), world_rank(rank_));
  }

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

  // The final layer's output over the unit's image tokens: reference tokens are dropped (diffusers'
  // FluxKontextPipeline and Flux2Pipeline keep noise_pred[:, :L]).
  at::Tensor noise_prediction(const flux::StreamState& s, const Unit& u) const {
    at::Tensor v = part_.final_layer(s);
    return v.size(1) == u.image.count ? v : v.narrow(1, 0, u.image.count);
  }

  std::vector<at::Tensor> collect(const WorkGroup& g, int64_t step, const Unit& u) {
    std::vector<at::Tensor> v;
    for (int pass = 0; pass < setup_.passes; ++pass) v.push_back(receive_noise_pred(g, step, pass, u));
    return v;
  }

  // Whether an exact step of the group fills the key/value caches for the pipelined step after it.
  bool fills_caches(const WorkGroup& g, int64_t step, const Unit& u) const {
    return u.patch < 0 && step + 1 < setup_.steps && !setup_.exact_step(g, step + 1);
  }

  ResidualRequest request(size_t gi, int64_t step, const Unit& u) const {
    const WorkGroup& g = setup_.groups[gi];
    ResidualRequest r;
    r.group = gi;
    r.step = step;
    r.patch = u.patch;
    r.text = u.text;
    r.image = u.image;
    r.fills = fills_caches(g, step, u);
    r.last = step == setup_.steps - 1 && (u.patch < 0 || u.patch == static_cast<int32_t>(setup_.patches) - 1);
    return r;
  }

  // This rank's residual per block it holds, from samples indexed by sample number.
  void set_residuals(const std::vector<at::Tensor>& by_sample) {
    const parallel::StageBlocks& b = plan_.blocks(rank_);
    residuals_.assign(static_cast<size_t>(b.count()), at::Tensor());
    for (int64_t i = 0; i < b.count(); ++i) {
      const int64_t sample = setup_.control.sample_of_block[static_cast<size_t>(b.first + i)];
      if (sample >= 0) residuals_[static_cast<size_t>(i)] = by_sample.at(static_cast<size_t>(sample));
    }
  }

  // Rank 0, after a unit's first stream message: each rank's samples, stacked, point to point.
  void send_residuals(const std::vector<at::Tensor>& samples, const WorkGroup& g, int64_t step, const Unit& u) {
    for (int r = 1; r < P_; ++r) {
      const std::vector<int64_t>& wanted = samples_of_rank_[static_cast<size_t>(r)];
      if (wanted.empty()) continue;
      std::vector<at::Tensor> parts;
      for (int64_t k : wanted) parts.push_back(samples.at(static_cast<size_t>(k)));
      messenger_->send(r, MessageTag{MessageKind::ControlResiduals, g.first_image, step, 0, u.patch}, {at::stack(parts)});
    }
  }

  // Ranks 1..S-1, after a unit's first stream message: the samples this rank's blocks add.
  void receive_residuals(const WorkGroup& g, int64_t step, const Unit& u) {
    const std::vector<int64_t>& wanted = samples_of_rank_[static_cast<size_t>(rank_)];
    std::vector<at::Tensor> by_sample;
    if (!wanted.empty()) {
      auto opts = at::TensorOptions().dtype(setup_.dtype).device(setup_.device);
      std::vector<at::Tensor> buffers = {at::empty(
          {static_cast<int64_t>(wanted.size()), g.count, u.image.count, part_.stream_dim()}, opts)};
      messenger_->recv_into(0, MessageTag{MessageKind::ControlResiduals, g.first_image, step, 0, u.patch}, buffers);
      by_sample.resize(static_cast<size_t>(wanted.back()) + 1);
      for (size_t j = 0; j < wanted.size(); ++j) by_sample[static_cast<size_t>(wanted[j])] = buffers[0][static_cast<int64_t>(j)];
    }
    set_residuals(by_sample);
  }

  // This rank's blocks on one unit, with the key/value caches when the step is pipelined or the
  // next one will be (an exact step fills them), and with the unit's residuals in a ControlNet step.
  void run_blocks(flux::StreamState& s, size_t gi, int64_t step, int pass, const Unit& u, bool control = false) {
    const WorkGroup& g = setup_.groups[gi];
    const bool pipelined = u.patch >= 0;
    const bool fills = fills_caches(g, step, u);
    const flux::BlockResiduals* residuals = control ? &residuals_ : nullptr;
    if (!pipelined && !fills) {
      part_.run_blocks(s, rope_, {}, nullptr, residuals);
      return;
    }
    std::vector<flux::KvCache>& kv = kv_[gi][static_cast<size_t>(pass)];
    if (kv.empty()) {
      FLUX_CHECK(fills, "patch ", u.patch, " of step ", step, " without a warm-up step before it");
      kv = part_.kv_caches(g.count, rope_.cos.size(0), at::TensorOptions().dtype(setup_.dtype).device(setup_.device));
    }
    for (flux::KvCache& c : kv) {
      c.offset = u.offset(setup_.text_tokens);
      c.tail = pipelined ? u.reference : 0;
    }
    part_.run_blocks(s, pipelined ? patch_rope_[static_cast<size_t>(u.patch)] : rope_, {}, &kv, residuals);
    // The group's last unit of its last step: its caches are not needed any more.
    if (step == setup_.steps - 1 && u.patch == static_cast<int32_t>(setup_.patches) - 1) kv.clear();
  }

  flux::TransformerInputs inputs(const RootState& root, size_t gi, int64_t step, int pass, const Unit& u) const {
    const GroupInputs& in = root.groups[gi];
    const int64_t m = setup_.groups[gi].count;
    flux::TransformerInputs t;
    t.latents = u.patch < 0 ? in.latents : in.latents.narrow(1, u.image.first, u.image.count).contiguous();
    if (u.reference > 0) t.latents = at::cat({t.latents, in.reference}, 1);
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
  int fault_rank_;  // the world rank faults name
  parallel::Messenger* messenger_;
  flux::RopeTables rope_;
  std::vector<Unit> patch_units_;                             // the M patches of a pipelined step
  std::vector<flux::RopeTables> patch_rope_;                  // and the RoPE rows of each
  std::vector<std::vector<std::vector<flux::KvCache>>> kv_;  // [group][pass][block held]
  std::vector<at::Tensor> step_v_;                            // rank 0, per group: v of the pipelined step being finished
  std::vector<std::vector<int64_t>> samples_of_rank_;         // ControlNets: the samples each rank's blocks add
  flux::BlockResiduals residuals_;                            // ControlNets: this rank's, for the current unit
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
