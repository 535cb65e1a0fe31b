#include "app/job_loop.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "app/decode_helper.h"
#include "app/decode_stage.h"
#include "app/leader_channel.h"
#include "app/leader_job.h"
#include "ckpt/checkpoint_writer.h"
#include "core/log.h"
#include "core/version.h"
#include "parallel/message.h"
#include "parallel/pipelines.h"
#include "parallel/work_counter.h"
#include "pipeline/family.h"
#include "pipeline/image_mode.h"
#include "pipeline/progress.h"

namespace fluxmpi::app {
namespace {

// "denoised in 9.87 s, 1.23 s (12.5 %) blocked on messages": the pipeline's bubbles as one rank
// sees them.
std::string denoise_text(double total, double blocked) {
  std::ostringstream os;
  os << "denoised in " << seconds_text(total) << ", " << seconds_text(blocked) << " (" << std::fixed
     << std::setprecision(1) << (total > 0 ? 100.0 * blocked / total : 0.0) << " %) blocked on messages";
  return os.str();
}

// Rank 0 writes rows and reports progress after every step, its own pipeline's and (with several
// pipelines) the other leaders'.
class RootObserver : public pipeline::DenoiseObserver {
 public:
  // t_start: per image, the steps of the full schedule its strength skips (0 without one). The
  // checkpoint counts an image's steps from there.
  RootObserver(ckpt::CheckpointWriter* writer, const pipeline::DenoiseSetup& setup, int64_t every,
               pipeline::Progress& progress, std::vector<int64_t> t_start)
      : writer_(writer), setup_(setup), steps_(setup.steps), every_(every), progress_(progress), t_start_(std::move(t_start)) {}
  // Rank 0's own steps; after each, the other leaders' messages that have come.
  void on_step(const pipeline::WorkGroup& g, int64_t step, const at::Tensor& latents, const at::Tensor& v) override {
    record(g, step, latents, v);
    if (after_own_step) after_own_step();
  }
  // latents and v may be undefined when no image of the group keeps the row.
  void record(const pipeline::WorkGroup& g, int64_t step, const at::Tensor& latents, const at::Tensor& v) {
    for (int64_t j = 0; j < g.count && writer_ != nullptr; ++j) {
      const int64_t i = g.first_image + j, t0 = t_start_[static_cast<size_t>(i)];
      // Before the row: its flush also covers the step's mode.
      writer_->write_step_mode(i, step - t0, setup_.exact_step(g, step));
      if (keep_row(step - t0, steps_ - t0, every_)) writer_->append_step(i, step - t0, latents[j], v[j]);
    }
    const int64_t t0 = t_start_[static_cast<size_t>(g.first_image)];
    progress_.advance(g.count, str_cat("image ", g.first_image, g.count > 1 ? str_cat("-", g.first_image + g.count - 1) : "",
                                       " step ", step - t0 + 1, "/", steps_ - t0));
  }
  std::function<void()> after_own_step;

 private:
  ckpt::CheckpointWriter* writer_;
  const pipeline::DenoiseSetup& setup_;
  int64_t steps_, every_;
  pipeline::Progress& progress_;
  std::vector<int64_t> t_start_;
};

// The job's shared counter as the step loop's source of work groups.
class CounterSource : public pipeline::WorkSource {
 public:
  explicit CounterSource(parallel::WorkCounter& counter) : counter_(counter) {}
  std::optional<size_t> next() override {
    const std::optional<int64_t> i = counter_.take();
    if (!i) return std::nullopt;
    return static_cast<size_t>(*i);
  }

 private:
  parallel::WorkCounter& counter_;
};

std::vector<std::pair<std::string, std::string>> png_text(const PreparedRun& run, size_t i) {
  const ckpt::ImageAttributes& a = run.attributes[i];
  std::vector<std::pair<std::string, std::string>> t = {
      {"prompt", a.prompt},
      {"seed", std::to_string(a.seed)},
      {"steps", std::to_string(a.num_inference_steps)},
      {"guidance", str_cat(a.guidance_scale)},
      {"size", str_cat(a.width, "x", a.height)},
      {"model", run.file.model},
      {"dtype", a.dtype},
      {"software", str_cat("fluxmpi ", kVersion)},
  };
  if (run.family->second_prompt()) t.insert(t.begin() + 1, {"prompt_2", a.prompt_2});
  if (!a.loras.empty()) t.push_back({"loras", io::loras_to_json(a.loras)});
  if (a.pipeline != "text2img") {
    t.push_back({"pipeline", a.pipeline});
    for (auto [key, in] : {std::pair<const char*, const ckpt::ImageAttributes::Input*>{"image", &a.image},
                           {"mask", &a.mask},
                           {"control_image", &a.control_image}})
      if (!in->path.empty()) t.push_back({key, in->path});
    for (size_t k = 0; k < a.references.size(); ++k) t.push_back({str_cat("image_", k), a.references[k].input.path});
    if (pipeline::uses_strength(*pipeline::parse_mode_name(a.pipeline))) t.push_back({"strength", str_cat(a.strength)});
  }
  if (ckpt::uses_true_cfg(a)) {
    t.push_back({"negative_prompt", a.negative_prompt});
    t.push_back({"true_cfg_scale", str_cat(a.true_cfg_scale)});
  }
  return t;
}

// One line per run: each stage's time and rank 0's peak resident memory during it.
void print_summary(const RootRun& root, double total) {
  std::string s = "summary:";
  uint64_t peak = 0;
  for (const auto& t : root.times) {
    s += str_cat(" ", t.name, " ", seconds_text(t.seconds), " (peak ", format_bytes(t.peak_rss), ")");
    peak = std::max(peak, t.peak_rss);
  }
  s += str_cat("; total ", seconds_text(total), "; peak RSS of rank 0 ", format_bytes(peak));
  log::info(s);
}

pipeline::DenoiseSetup setup_of(const RunPlan& plan, at::ScalarType dtype, at::Device device, const pipeline::Fault& fault) {
  pipeline::DenoiseSetup setup;
  setup.steps = plan.steps;
  setup.text_tokens = plan.text_tokens;
  setup.latent_height = plan.latent_height;
  setup.latent_width = plan.latent_width;
  setup.references = plan.references;
  setup.passes = plan.passes;
  setup.patches = plan.patches;
  setup.warmup_steps = plan.warmup_steps;
  setup.groups = plan.groups;
  setup.dtype = dtype;
  setup.device = device;
  setup.fault = fault;
  return setup;
}

}  // namespace

void run_pipelines(const RunPlan& plan, const parallel::MpiEnv& env, RootRun* root, std::shared_ptr<flux::StageModel>& part,
                   std::unique_ptr<pipeline::ResidualSource>& control, const parallel::StagePlan& stages, at::ScalarType dtype, at::Device device, const pipeline::Fault& fault,
                   Clock::time_point start) {
  const int rank = env.rank();
  const parallel::PipelineLayout layout = parallel::PipelineLayout::make(plan.world_size, plan.stages);
  const int pipelines = layout.pipelines(), stage = layout.stage_of(rank);
  const parallel::PipelineComms comms(env.world(), layout);
  pipeline::DenoiseSetup setup = setup_of(plan, dtype, device, fault);
  setup.first_world_rank = layout.leader_of_pipeline(layout.pipeline_of(rank));
  setup.control = pipeline::family_named(plan.family).control_routing(io::ModelDir(plan.sources), plan);
  // A rank's warm-up while it waits must not take cores that rank 0 computes on.
  setup.warm_up_while_waiting = device.is_cuda() || env.local_size() * at::get_num_threads() <= env.node_cpus();
  std::unique_ptr<parallel::Messenger> messenger;
  if (layout.stages() > 1) messenger = std::make_unique<parallel::Messenger>(comms.pipeline);

  if (stage != 0) {
    auto t0 = Clock::now();
    pipeline::denoise(setup, *part, stages, stage, messenger.get(), nullptr);
    const double blocked = messenger->blocked_seconds();
    messenger.reset();
    log::debug(denoise_text(seconds_since(t0), blocked), "; peak RSS ", format_bytes(peak_rss_bytes()));
    if (helps_decode(plan, stage)) {
      part = nullptr;  // its blocks are done: the slice goes before the VAE decoder comes
      help_decode(plan, comms.pipeline, dtype, device);
    }
    return;
  }

  // A pipeline leader. World rank 0 prepares every group's inputs and writes what the checkpoint
  // holds before the loop; the other leaders receive the inputs.
  std::optional<ckpt::CheckpointWriter> writer;
  LeaderJob job;
  if (rank == 0) {
    PreparedRun& run = root->prepared;
    const std::string& ckpt_path = run.config.checkpoint_file();
    if (run.resumed) writer.emplace(ckpt::CheckpointWriter::resume(ckpt_path, run.file, run.attributes));
    else if (!ckpt_path.empty()) writer.emplace(ckpt::CheckpointWriter::create(ckpt_path, run.file, run.attributes));
    job = make_leader_job(*root, plan, writer ? &*writer : nullptr, device);
    if (const std::string inputs = run.family_root->inputs_text(run); !inputs.empty()) log::info(inputs);
  }
  share_leader_job(job, comms.leaders, device);
  job.install_blend();
  if (control != nullptr) {
    control->take_inputs(job.state.groups);
    job.state.control = control.get();
  }

  // Hand-out: with several pipelines each leader takes the next group from the shared counter
  // whenever one of its S slots is free.
  std::optional<parallel::WorkCounter> counter;
  std::optional<CounterSource> source;
  if (pipelines > 1) {
    counter.emplace(comms.leaders, static_cast<int64_t>(plan.groups.size()));
    source.emplace(*counter);
    job.state.source = &*source;
    job.state.slots = static_cast<size_t>(layout.stages());
  }
  std::vector<int64_t> mine;  // the images this leader decodes
  job.state.on_group_done = [&](size_t gi) {
    const pipeline::WorkGroup& g = plan.groups[gi];
    for (int64_t j = 0; j < g.count; ++j) mine.push_back(g.first_image + j);
  };
  // After the loop: the final latents of the images this leader decodes, the inputs dropped.
  std::map<int64_t, at::Tensor> finals;
  auto keep_finals = [&]() {
    for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
      const pipeline::WorkGroup& g = plan.groups[gi];
      for (int64_t j = 0; j < g.count; ++j)
        if (std::binary_search(mine.begin(), mine.end(), g.first_image + j))
          finals[g.first_image + j] = job.state.groups[gi].latents[j].unsqueeze(0);
    }
    for (size_t i = 0; i < job.decode_only.size(); ++i)
      if (job.decode_only[i].defined()) finals[static_cast<int64_t>(i)] = job.decode_only[i];
    job.state.groups.clear();
    job.decode_only.clear();
  };
  auto final_latents = [&](int64_t i) { return finals.at(i); };

  if (rank != 0) {
    // Another leader: its rows and images go to rank 0.
    RowSender sender(comms.leaders, plan, job.t_start);
    job.state.observer = &sender;
    const auto t0 = Clock::now();
    pipeline::denoise(setup, *part, stages, 0, messenger.get(), &job.state);
    log::debug(denoise_text(seconds_since(t0), messenger ? messenger->blocked_seconds() : 0.0), "; ", counter->taken(),
               " work group(s) taken");
    messenger.reset();
    std::sort(mine.begin(), mine.end());
    keep_finals();
    part = nullptr;  // stage-wise memory: the transformer slice (and the ControlNets) go before the VAE comes
    control.reset();
    decode_images(io::ModelDir(plan.sources), plan, comms.pipeline, dtype, device, mine, final_latents,
                  [&](int64_t i, const io::RgbImage& pixels) { sender.send_image(i, pixels); });
    sender.finish();
    counter->close();
    return;
  }
  // World rank 0: its own pipeline's groups, the checkpoint and the PNGs of every image; with
  // several pipelines also the other leaders' messages, whenever it can take them.
  PreparedRun& run = root->prepared;
  const RunConfig& c = run.config;
  int64_t total = 0;
  for (const auto& g : plan.groups) total += g.count * (plan.steps - g.start_step);
  pipeline::Progress progress(total, !c.no_progress);
  RootObserver observer(writer ? &*writer : nullptr, setup, c.checkpoint_every, progress, job.t_start);
  job.state.observer = &observer;
  int64_t written = 0;
  auto store = [&](int64_t i, const io::RgbImage& pixels) {
    io::write_png(run.images[static_cast<size_t>(i)].output_path, pixels, png_text(run, static_cast<size_t>(i)));
    if (writer) {
      writer->write_image(i, pixels);
      writer->set_status(i, ckpt::ImageStatus::Decoded);
    }
    log::info("wrote ", run.images[static_cast<size_t>(i)].output_path);
    ++written;
  };
  std::optional<LeaderInbox> inbox;
  std::function<void()> serve;
  if (pipelines > 1) {
    LeaderInbox::Handlers handlers;
    handlers.step = [&](const pipeline::WorkGroup& g, int64_t step, const at::Tensor& x, const at::Tensor& v) {
      observer.record(g, step, x, v);
    };
    handlers.image = store;
    inbox.emplace(comms.leaders, plan, job.t_start, std::move(handlers));
    serve = [&] { inbox->poll(); };
    observer.after_own_step = serve;
    if (messenger) messenger->set_idle(serve);
  }
  const auto t_denoise = Clock::now();
  if (rank == 0) {
    const double started = process_start_epoch_seconds(), now = std::chrono::duration<double>(
                                                               std::chrono::system_clock::now().time_since_epoch()).count();
    log::debug("first denoising step: ", seconds_text(seconds_since(start)), " after the run began, ",
               seconds_text(now - started), " after the process started (at ", std::fixed, std::setprecision(2), started,
               " s since the epoch)");
  }
  pipeline::denoise(setup, *part, stages, 0, messenger.get(), &job.state);
  if (messenger) log::debug(denoise_text(seconds_since(t_denoise), messenger->blocked_seconds()));
  if (counter) log::debug(counter->taken(), " work group(s) taken");
  messenger.reset();
  if (!inbox) progress.finish();
  root->times.push_back({"denoise", seconds_since(t_denoise), stage_peak()});

  // Rank 0 decodes its own pipeline's images and those resumed with only the decode left; with
  // one pipeline that is every image still to decode, in order.
  for (size_t i = 0; i < job.decode_only.size(); ++i)
    if (job.decode_only[i].defined()) mine.push_back(static_cast<int64_t>(i));
  std::sort(mine.begin(), mine.end());
  keep_finals();
  part = nullptr;  // stage-wise memory: the transformer slice (and the ControlNets) go before the VAE comes
  control.reset();
  const auto t_decode = Clock::now();
  if (decode_images(*run.model, plan, comms.pipeline, dtype, device, mine, final_latents, store, serve))
    root->times.push_back({"decode", seconds_since(t_decode), stage_peak()});
  if (inbox) {
    const auto t_wait = Clock::now();
    inbox->serve_until_done();
    progress.finish();
    root->times.push_back({"other pipelines", seconds_since(t_wait), stage_peak()});
  }
  const double made = seconds_since(t_denoise);
  log::info("made ", written, " image", written == 1 ? "" : "s", " in ", seconds_text(made), " on ", pipelines, " pipeline",
            pipelines == 1 ? "" : "s", " (", std::fixed, std::setprecision(1), made > 0 ? 3600.0 * written / made : 0.0,
            " images/hour, from the first denoising step to the last image written)");
  if (writer) writer->close();
  if (counter) counter->close();
  print_summary(*root, seconds_since(start));
}

}  // namespace fluxmpi::app
