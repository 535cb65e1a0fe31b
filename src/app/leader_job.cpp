#include "app/leader_job.h"

#include "core/error.h"
#include "parallel/tensor_broadcast.h"
#include "pipeline/family.h"

namespace fluxmpi::app {
namespace {

// The tensors of one group's inpaint blend (share_leader_job).
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
  const pipeline::Family& family = *run.family;
  const pipeline::FamilyRoot& family_root = *run.family_root;
  const sched::Schedule schedule = family.schedule(*run.model, *c.steps, run.geometry.tokens());
  const size_t n = run.images.size();
  std::vector<at::Tensor> latents(n), text(n), pooled(n), neg_text(n), neg_pooled(n);
  std::vector<pipeline::Conditioning> cond(n);  // features and inpaint tensors per image
  const pipeline::PromptEmbeddings& prompts = root.prompts;
  for (size_t i = 0; i < n; ++i) {
    const ImageProgress& p = run.progress[i];
    if (p.decoded) continue;
    if (p.needs_encoding) {
      if (!root.conditioning.empty()) cond[i] = root.conditioning[i].conditioning;
      latents[i] = cond[i].initial.defined() ? cond[i].initial
                                             : family.initial_latents(run.images[i].seed, run.geometry, dtype);
      text[i] = prompts.text[i].prompt_embeds;
      pooled[i] = prompts.text[i].pooled;
      if (plan.passes == 2) {
        neg_text[i] = prompts.negative[i].prompt_embeds;
        neg_pooled[i] = prompts.negative[i].pooled;
      }
      if (writer != nullptr) {
        writer->write_text(static_cast<int64_t>(i),
                           family_root.text_to_checkpoint(prompts.text[i], plan.passes == 2 ? &prompts.negative[i] : nullptr));
        const sched::Schedule cut = pipeline::cut_schedule(schedule, inputs.images[i].t_start);
        writer->write_schedule(static_cast<int64_t>(i), at::tensor(cut.timesteps), at::tensor(cut.sigmas));
        writer->write_initial(static_cast<int64_t>(i), latents[i][0]);
        if (!root.conditioning.empty())
          family_root.write_conditioning(*writer, static_cast<int64_t>(i), run, root.conditioning[i]);
        writer->set_status(static_cast<int64_t>(i), ckpt::ImageStatus::Denoising);
      }
    } else {
      const ckpt::CheckpointReader& r = writer->contents();
      const ckpt::TextEmbeddings stored = r.text(static_cast<int64_t>(i));
      latents[i] = r.latest_latents(static_cast<int64_t>(i)).to(dtype).unsqueeze(0);
      cond[i] = family_root.stored_conditioning(r, static_cast<int64_t>(i), run, dtype);
      const pipeline::PromptEmbedding e = family_root.text_from_checkpoint(stored, false, dtype);
      text[i] = e.prompt_embeds;
      pooled[i] = e.pooled;
      if (plan.passes == 2) {
        const pipeline::PromptEmbedding neg = family_root.text_from_checkpoint(stored, true, dtype);
        neg_text[i] = neg.prompt_embeds;
        neg_pooled[i] = neg.pooled;
      }
    }
  }
  root.prompts = {};
  root.conditioning.clear();

  pipeline::RootState& state = job.state;
  state.schedule = schedule;
  family_root.sampling(run, plan, state);
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
    in.controlnet = gather_cond(&pipeline::Conditioning::controlnet);
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
      for (const at::Tensor* x : s.groups[gi].tensors()) t.push_back(*x);
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
  const size_t group_tensors = pipeline::GroupInputs{}.tensors().size();
  const size_t per_group = group_tensors + (job.inpaint ? kBlendTensors : 0);
  FLUX_CHECK(t.size() == 4 + groups * per_group, "leader job of ", t.size(), " tensors for ", groups, " groups");
  auto on_device = [&](size_t k) { return t[k].defined() ? t[k].to(device) : at::Tensor(); };
  s.groups.clear();
  job.blends.clear();
  for (size_t gi = 0; gi < groups; ++gi) {
    const size_t k = 4 + gi * per_group;
    pipeline::GroupInputs g;
    size_t f = k;
    for (at::Tensor* x : g.tensors()) *x = on_device(f++);
    s.groups.push_back(std::move(g));
    if (job.inpaint) {
      pipeline::Conditioning b;
      b.image_latents = on_device(k + group_tensors);
      b.noise = on_device(k + group_tensors + 1);
      b.mask = on_device(k + group_tensors + 2);
      job.blends.push_back(std::move(b));
    }
  }
}

}  // namespace fluxmpi::app
