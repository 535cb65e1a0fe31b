#include "app/leader_job.h"

#include "pipeline/flux2/stages.h"
#include "core/error.h"
#include "parallel/tensor_broadcast.h"
#include "pipeline/noise.h"

namespace fluxmpi::app {

using pipeline::flux2_initial_latents;
using pipeline::flux2_run_schedule;
using pipeline::stored_conditioning;
using pipeline::write_conditioning;
namespace {

ckpt::TextEmbeddings to_checkpoint(const pipeline::PromptEmbedding& e, const pipeline::PromptEmbedding* neg) {
  ckpt::TextEmbeddings t;
  t.prompt_embeds = e.prompt_embeds;
  if (e.input_ids.defined()) {  // FLUX.2
    t.input_ids = e.input_ids;
    t.attention_mask = e.attention_mask;
    if (neg != nullptr) {
      t.negative_prompt_embeds = neg->prompt_embeds;
      t.negative_input_ids = neg->input_ids;
      t.negative_attention_mask = neg->attention_mask;
    }
    return t;
  }
  t.pooled_prompt_embeds = e.pooled;
  t.clip_input_ids = e.clip_ids;
  t.t5_input_ids = e.t5_ids;
  if (neg != nullptr) {
    t.negative_prompt_embeds = neg->prompt_embeds;
    t.negative_pooled_prompt_embeds = neg->pooled;
  }
  return t;
}

// The tensors of one group's inputs, in a fixed order (share_leader_job).
constexpr int kGroupTensors = 7;
constexpr int kBlendTensors = 3;

}  // namespace

void LeaderJob::install_blend() {
  if (!inpaint) return;
  state.after_step = [this](size_t gi, int64_t step, pipeline::TokenRange rows, const at::Tensor& x) {
    const pipeline::Conditioning& b = blends[gi];
    auto part = [&](const at::Tensor& t) { return t.narrow(1, rows.first, rows.count); };
    return pipeline::inpaint_blend(x, part(b.image_latents), part(b.noise), part(b.mask), state.schedule, step);
  };
}

LeaderJob make_leader_job(RootRun& root, const RunPlan& plan, ckpt::CheckpointWriter* writer, at::Device device) {
  PreparedRun& run = root.prepared;
  const RunConfig& c = run.config;
  const at::ScalarType dtype = root.dtype;
  LeaderJob job;

  // Inputs of every image: fresh ones from stage 1 and their seeds, resumed ones from the file.
  // The full schedule of --steps (its shift from the whole image): an image with a strength
  // starts at its t_start; its checkpoint holds the cut schedule and the rows from there.
  const JobInputs& inputs = run.inputs;
  const bool flux2 = plan.family == "flux2";
  const sched::Schedule schedule = flux2 ? flux2_run_schedule(*run.model, *c.steps, run.geometry.tokens())
                                         : sched::flux_schedule(run.model->scheduler_config(), *c.steps, run.geometry.tokens());
  const size_t n = run.images.size();
  std::vector<at::Tensor> latents(n), text(n), pooled(n), neg_text(n), neg_pooled(n);
  std::vector<pipeline::Conditioning> cond(n);  // features and inpaint tensors per image
  for (size_t i = 0; i < n; ++i) {
    const ImageProgress& p = run.progress[i];
    if (p.decoded) continue;
    if (p.needs_encoding) {
      if (!root.conditioning.empty()) cond[i] = root.conditioning[i].conditioning;
      if (flux2) latents[i] = flux2_initial_latents(run.images[i].seed, run.geometry, dtype);
      else latents[i] = cond[i].initial.defined() ? cond[i].initial
                                                  : pipeline::initial_latents(run.images[i].seed, run.geometry, dtype);
      text[i] = root.text[i].prompt_embeds;
      pooled[i] = root.text[i].pooled;
      if (plan.passes == 2) {
        neg_text[i] = root.negative[i].prompt_embeds;
        neg_pooled[i] = root.negative[i].pooled;
      }
      if (writer != nullptr) {
        writer->write_text(static_cast<int64_t>(i), to_checkpoint(root.text[i], plan.passes == 2 ? &root.negative[i] : nullptr));
        const sched::Schedule cut = pipeline::cut_schedule(schedule, inputs.images[i].t_start);
        writer->write_schedule(static_cast<int64_t>(i), at::tensor(cut.timesteps), at::tensor(cut.sigmas));
        writer->write_initial(static_cast<int64_t>(i), latents[i][0]);
        if (!root.conditioning.empty()) write_conditioning(*writer, static_cast<int64_t>(i), inputs.mode, root.conditioning[i]);
        writer->set_status(static_cast<int64_t>(i), ckpt::ImageStatus::Denoising);
      }
    } else {
      const ckpt::CheckpointReader& r = writer->contents();
      ckpt::TextEmbeddings stored = r.text(static_cast<int64_t>(i));
      latents[i] = r.latest_latents(static_cast<int64_t>(i)).to(dtype).unsqueeze(0);
      cond[i] = stored_conditioning(r, static_cast<int64_t>(i), inputs.mode, dtype);
      text[i] = stored.prompt_embeds.to(dtype);
      if (!flux2) pooled[i] = stored.pooled_prompt_embeds.to(dtype);  // FLUX.2 has no pooled input
      if (plan.passes == 2) {
        neg_text[i] = stored.negative_prompt_embeds.to(dtype);
        if (!flux2) neg_pooled[i] = stored.negative_pooled_prompt_embeds.to(dtype);
      }
    }
  }
  root.text.clear();
  root.negative.clear();
  root.conditioning.clear();

  pipeline::RootState& state = job.state;
  state.schedule = schedule;
  if (flux2) {
    state.guidance = plan.guidance;  // dev's guidance embedder; klein: none
    state.true_cfg_scale = *c.guidance;  // klein base: uncond + g (cond - uncond), as FLUX.1's true CFG
  } else {
    if (run.model->transformer_config().guidance_embeds) state.guidance = *c.guidance;
    state.true_cfg_scale = c.true_cfg;
  }
  job.inpaint = inputs.mode == pipeline::PipelineMode::Inpaint;
  for (const auto& g : plan.groups) {
    auto gather = [&](const std::vector<at::Tensor>& per_image, bool batch_dim) {
      if (!per_image[static_cast<size_t>(g.first_image)].defined()) return at::Tensor();
      std::vector<at::Tensor> parts;
      for (int64_t j = 0; j < g.count; ++j) {
        const at::Tensor& t = per_image[static_cast<size_t>(g.first_image + j)];
        parts.push_back(batch_dim ? t : t.unsqueeze(0));
      }
      return at::cat(parts, 0).to(device);
    };
    pipeline::GroupInputs in;
    in.latents = gather(latents, true);
    in.text = gather(text, false);
    in.pooled = gather(pooled, false);
    in.neg_text = gather(neg_text, false);
    in.neg_pooled = gather(neg_pooled, false);
    auto gather_cond = [&](at::Tensor pipeline::Conditioning::*field) {
      std::vector<at::Tensor> per_image;
      for (size_t i = 0; i < n; ++i) per_image.push_back(cond[i].*field);
      return gather(per_image, true);
    };
    in.features = gather_cond(&pipeline::Conditioning::features);
    in.reference = gather_cond(&pipeline::Conditioning::reference);
    state.groups.push_back(std::move(in));
    if (job.inpaint) {
      pipeline::Conditioning b;
      b.image_latents = gather_cond(&pipeline::Conditioning::image_latents);
      b.noise = gather_cond(&pipeline::Conditioning::noise);
      b.mask = gather_cond(&pipeline::Conditioning::mask);
      job.blends.push_back(std::move(b));
    }
  }
  job.t_start.resize(n);
  for (size_t i = 0; i < n; ++i) job.t_start[i] = inputs.images[i].t_start;
  // Images resumed with only their decode left belong to no group.
  job.decode_only.resize(n);
  for (size_t i = 0; i < n; ++i)
    if (!run.progress[i].decoded && run.progress[i].start_step >= plan.steps) job.decode_only[i] = latents[i];
  return job;
}

void share_leader_job(LeaderJob& job, const parallel::Communicator& leaders, at::Device device) {
  if (leaders.size() <= 1) return;
  // The other leaders wait here while rank 0 writes the checkpoint's first datasets: sleeping, so
  // that ranks sharing its cores leave them to it.
  leaders.quiet_barrier();
  const bool root = leaders.rank() == 0;
  pipeline::RootState& s = job.state;
  std::vector<at::Tensor> t;
  if (root) {
    const double meta[] = {s.guidance ? 1.0 : 0.0, s.guidance.value_or(0.0), s.true_cfg_scale, job.inpaint ? 1.0 : 0.0,
                           s.schedule.mu, static_cast<double>(s.groups.size())};
    t.push_back(at::tensor(at::ArrayRef<double>(meta, std::size(meta)), at::kDouble));
    t.push_back(at::tensor(s.schedule.timesteps));
    t.push_back(at::tensor(s.schedule.sigmas));
    t.push_back(at::tensor(job.t_start, at::kLong));
    for (size_t gi = 0; gi < s.groups.size(); ++gi) {
      const pipeline::GroupInputs& g = s.groups[gi];
      for (const at::Tensor& x : {g.latents, g.text, g.pooled, g.neg_text, g.neg_pooled, g.features, g.reference}) t.push_back(x);
      if (job.inpaint)
        for (const at::Tensor& x : {job.blends[gi].image_latents, job.blends[gi].noise, job.blends[gi].mask}) t.push_back(x);
    }
  }
  parallel::broadcast_tensors(leaders, t, 0);
  if (root) return;
  FLUX_CHECK(t.size() >= 4 && t[0].numel() == 6, "leader job of ", t.size(), " tensors");
  const auto* meta = t[0].data_ptr<double>();
  if (meta[0] != 0.0) s.guidance = meta[1];
  s.true_cfg_scale = meta[2];
  job.inpaint = meta[3] != 0.0;
  s.schedule.mu = meta[4];
  const size_t groups = static_cast<size_t>(meta[5]);
  auto floats = [](const at::Tensor& x) { return std::vector<float>(x.data_ptr<float>(), x.data_ptr<float>() + x.numel()); };
  s.schedule.timesteps = floats(t[1]);
  s.schedule.sigmas = floats(t[2]);
  job.t_start.assign(t[3].data_ptr<int64_t>(), t[3].data_ptr<int64_t>() + t[3].numel());
  const size_t per_group = kGroupTensors + (job.inpaint ? kBlendTensors : 0);
  FLUX_CHECK(t.size() == 4 + groups * per_group, "leader job of ", t.size(), " tensors for ", groups, " groups");
  auto on_device = [&](size_t k) { return t[k].defined() ? t[k].to(device) : at::Tensor(); };
  s.groups.clear();
  job.blends.clear();
  for (size_t gi = 0; gi < groups; ++gi) {
    const size_t k = 4 + gi * per_group;
    pipeline::GroupInputs g;
    g.latents = on_device(k);
    g.text = on_device(k + 1);
    g.pooled = on_device(k + 2);
    g.neg_text = on_device(k + 3);
    g.neg_pooled = on_device(k + 4);
    g.features = on_device(k + 5);
    g.reference = on_device(k + 6);
    s.groups.push_back(std::move(g));
    if (job.inpaint) {
      pipeline::Conditioning b;
      b.image_latents = on_device(k + 7);
      b.noise = on_device(k + 8);
      b.mask = on_device(k + 9);
      job.blends.push_back(std::move(b));
    }
  }
}

}  // namespace fluxmpi::app
