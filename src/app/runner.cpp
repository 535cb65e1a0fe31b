#include "app/runner.h"

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>

#include "app/decode_helper.h"
#include "app/flux2_stages.h"
#include "app/image_stage.h"
#include "app/prepare.h"
#include "ckpt/checkpoint_writer.h"
#include "core/log.h"
#include "core/units.h"
#include "core/version.h"
#include "parallel/device.h"
#include "parallel/message.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "models/flux/lora_targets.h"
#include "models/flux/transformer.h"
#include "models/vae/image_processor.h"
#include "models/vae/vae_decoder.h"
#include "pipeline/image_mode.h"
#include "pipeline/noise.h"
#include "pipeline/progress.h"
#include "pipeline/text_stage.h"
#include "pipeline/tile_decode.h"

namespace fluxmpi::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "1.23 s"
std::string seconds_text(double seconds) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << seconds << " s";
  return os.str();
}

// "denoised in 9.87 s, 1.23 s (12.5 %) blocked on messages": the pipeline's bubbles as one rank
// sees them.
std::string denoise_text(double total, double blocked) {
  std::ostringstream os;
  os << "denoised in " << seconds_text(total) << ", " << seconds_text(blocked) << " (" << std::fixed
     << std::setprecision(1) << (total > 0 ? 100.0 * blocked / total : 0.0) << " %) blocked on messages";
  return os.str();
}

// "1, 2, 3"
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += str_cat(s.empty() ? "" : ", ", r);
  return s;
}

struct StageTime {
  std::string name;
  double seconds;
  uint64_t peak_rss;  ///< peak resident memory during the stage
};

// The stage's peak, and a fresh peak for the next stage.
uint64_t stage_peak() {
  const uint64_t peak = peak_rss_bytes();
  reset_peak_rss();
  return peak;
}

// Rank 0's state between the phases.
struct RootRun {
  PreparedRun prepared;
  at::ScalarType dtype = at::kFloat;
  std::vector<pipeline::PromptEmbedding> text;      // per image (fresh ones)
  std::vector<pipeline::PromptEmbedding> negative;  // per image, true CFG
  std::optional<pipeline::TextEncoders> kept_encoders;
  std::vector<EncodedImage> conditioning;  // per image, from the input images
  std::vector<StageTime> times;
};

// FLUX.2's stage 1: one decoder-only encoder; klein base's true CFG encodes the empty prompt.
void encode_flux2_prompts(RootRun& root, at::Device device) {
  PreparedRun& run = root.prepared;
  auto t0 = Clock::now();
  Flux2TextStage encoder(*run.model, run.plan.text_encoder_layers, root.dtype, device);
  const int64_t msl = *run.config.max_sequence_length;
  std::map<std::string, pipeline::PromptEmbedding> cache;
  auto embed = [&](const std::string& p, const std::string& what) {
    auto it = cache.find(p);
    if (it == cache.end()) it = cache.emplace(p, encoder.encode(p, msl, what)).first;
    return it->second;
  };
  root.text.resize(run.images.size());
  root.negative.resize(run.images.size());
  const bool cfg = run.plan.passes == 2;
  for (size_t i = 0; i < run.images.size(); ++i) {
    if (run.progress[i].decoded || !run.progress[i].needs_encoding) continue;
    root.text[i] = embed(run.images[i].prompt, str_cat("image ", i));
    if (cfg) root.negative[i] = embed("", str_cat("image ", i, " (the empty negative prompt)"));
  }
  log::info("encoded ", cache.size(), " distinct prompt(s) in ", seconds_text(seconds_since(t0)), " (text encoder: ",
            format_bytes(static_cast<uint64_t>(encoder.parameter_bytes())), ")");
  root.times.push_back({"encode", seconds_since(t0), stage_peak()});
}

// FLUX.2's stage 1 over the ranks holding the text encoder's slices: rank 0's distinct prompts
// (and klein base's empty negative prompt) in order, every rank taking part.
void encode_flux2_split(RootRun* root, const Flux2SplitTextStage& stage, const parallel::MpiEnv& env) {
  std::vector<std::string> distinct;
  std::map<std::string, size_t> index;
  if (root != nullptr) {
    const PreparedRun& run = root->prepared;
    auto add = [&](const std::string& p) {
      if (index.emplace(p, distinct.size()).second) distinct.push_back(p);
    };
    for (size_t i = 0; i < run.images.size(); ++i) {
      if (run.progress[i].decoded || !run.progress[i].needs_encoding) continue;
      add(run.images[i].prompt);
      if (run.plan.passes == 2) add("");
    }
  }
  std::unique_ptr<parallel::Messenger> messenger = std::make_unique<parallel::Messenger>(env);
  const int64_t msl = root != nullptr ? *root->prepared.config.max_sequence_length : 0;
  const std::vector<pipeline::PromptEmbedding> embeds = stage.encode(env, messenger.get(), distinct, msl);
  messenger->wait_all();
  if (root == nullptr) return;
  PreparedRun& run = root->prepared;
  root->text.resize(run.images.size());
  root->negative.resize(run.images.size());
  for (size_t i = 0; i < run.images.size(); ++i) {
    if (run.progress[i].decoded || !run.progress[i].needs_encoding) continue;
    root->text[i] = embeds.at(index.at(run.images[i].prompt));
    if (run.plan.passes == 2) root->negative[i] = embeds.at(index.at(""));
  }
}

// Stage 1 on rank 0: each distinct prompt once, with the encoders freed afterwards.
void encode_prompts(RootRun& root, at::Device device) {
  PreparedRun& run = root.prepared;
  if (!run.any_encoding()) return;
  if (run.plan.family == "flux2") {
    if (run.plan.text_slices.empty()) encode_flux2_prompts(root, device);  // else: encoded over the ranks already
    return;
  }
  auto t0 = Clock::now();
  pipeline::TextEncoders encoders(*run.model, root.dtype, device, run.loras.files);
  const int64_t msl = *run.config.max_sequence_length;
  std::map<std::pair<std::string, std::string>, pipeline::PromptEmbedding> cache;
  auto embed = [&](const std::string& p, const std::string& p2, const std::string& what) {
    auto key = std::make_pair(p, p2);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, encoders.encode(p, p2, msl, what)).first;
    return it->second;
  };
  root.text.resize(run.images.size());
  root.negative.resize(run.images.size());
  const bool cfg = run.plan.passes == 2;
  for (size_t i = 0; i < run.images.size(); ++i) {
    if (run.progress[i].decoded || !run.progress[i].needs_encoding) continue;
    const ImageJob& job = run.images[i];
    root.text[i] = embed(job.prompt, job.prompt_2, str_cat("image ", i));
    if (cfg) root.negative[i] = embed(job.negative_prompt, job.negative_prompt, str_cat("image ", i, " (negative prompt)"));
  }
  log::info("encoded ", cache.size(), " distinct prompt(s) in ", seconds_text(seconds_since(t0)), " (text encoders: ",
            format_bytes(static_cast<uint64_t>(encoders.parameter_bytes())), ")");
  if (run.config.keep_encoders) root.kept_encoders.emplace(std::move(encoders));
  root.times.push_back({"encode", seconds_since(t0), stage_peak()});
}

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

// Rank 0 writes rows and reports progress after every step.
class RootObserver : public pipeline::DenoiseObserver {
 public:
  // t_start: per image, the steps of the full schedule its strength skips (0 without one). The
  // checkpoint counts an image's steps from there.
  RootObserver(ckpt::CheckpointWriter* writer, const pipeline::DenoiseSetup& setup, int64_t every,
               pipeline::Progress& progress, std::vector<int64_t> t_start)
      : writer_(writer), setup_(setup), steps_(setup.steps), every_(every), progress_(progress), t_start_(std::move(t_start)) {}
  void on_step(const pipeline::WorkGroup& g, int64_t step, const at::Tensor& latents, const at::Tensor& v) override {
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

 private:
  ckpt::CheckpointWriter* writer_;
  const pipeline::DenoiseSetup& setup_;
  int64_t steps_, every_;
  pipeline::Progress& progress_;
  std::vector<int64_t> t_start_;
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
  if (a.family == "flux1") t.insert(t.begin() + 1, {"prompt_2", a.prompt_2});
  if (!a.loras.empty()) t.push_back({"loras", io::loras_to_json(a.loras)});
  if (a.pipeline != "text2img") {
    t.push_back({"pipeline", a.pipeline});
    for (auto [key, in] : {std::pair<const char*, const ckpt::ImageAttributes::Input*>{"image", &a.image},
                           {"mask", &a.mask},
                           {"control_image", &a.control_image}})
      if (!in->path.empty()) t.push_back({key, in->path});
    if (pipeline::uses_strength(*pipeline::parse_mode_name(a.pipeline))) t.push_back({"strength", str_cat(a.strength)});
  }
  if (ckpt::uses_true_cfg(a)) {
    t.push_back({"negative_prompt", a.negative_prompt});
    t.push_back({"true_cfg_scale", str_cat(a.true_cfg_scale)});
  }
  return t;
}

// Reports an error caught in a collective phase; returns its exit code.
int report(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) {
    log::report(*error);
    return error->exit_code();
  }
  log::report(InternalError(e.what()));
  return kExitFailure;
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

}  // namespace

int run_fluxmpi(const std::vector<std::string>& args, parallel::MpiEnv& env) {
  const auto start = Clock::now();
  const int rank = env.rank(), P = env.size();

  // Phase 1: rank 0 validates; every rank learns the outcome.
  std::unique_ptr<RootRun> root;
  std::string message;  // JSON plan, or empty with an exit code
  int code = kExitOk;
  if (rank == 0) {
    try {
      Preparation prep = prepare_run(args, P);
      if (!prep.output.empty()) std::fputs(prep.output.c_str(), stdout), std::fflush(stdout);
      code = prep.exit_code;
      if (prep.run) {
        root = std::make_unique<RootRun>();
        root->prepared = std::move(*prep.run);
        root->dtype = nn::parse_dtype(root->prepared.config.dtype);
        root->times.push_back({"validate", seconds_since(start), stage_peak()});
        message = to_json(root->prepared.plan);
      }
    } catch (const std::exception& e) {
      code = report(e);
    }
  }
  std::vector<int64_t> status = env.broadcast_int64s({code, message.empty() ? 0 : 1});
  if (status[0] != kExitOk || status[1] == 0) return static_cast<int>(status[0]);
  const RunPlan plan = run_plan_from_json(env.broadcast_string(message));
  log::set_level(static_cast<log::Level>(plan.log_level));

  // Phase 2: encode (rank 0), load every slice; then agree on the outcome.
  const at::ScalarType dtype = nn::parse_dtype(plan.dtype);
  at::Device device = at::kCPU;
  std::shared_ptr<flux::StageModel> part;  // this rank's blocks, FLUX.1 or FLUX.2
  std::optional<parallel::StagePlan> stages;
  pipeline::Fault fault;
  code = kExitOk;
  auto t_load = Clock::now();
  try {
    fault = pipeline::Fault::from_environment();
    device = parallel::select_device(plan.device, env);
    parallel::apply_threads(parallel::resolve_threads(static_cast<int>(plan.threads), env));
  } catch (const std::exception& e) {
    code = report(e);
  }
  if (!plan.text_slices.empty()) {
    // FLUX.2's text encoder over the leading ranks: all of them load their slices and agree, then
    // encode together (a failure from here on aborts the job, as in the denoising loop).
    code = env.agree(code);
    if (code != kExitOk) return code;
    const auto t0 = Clock::now();
    std::optional<Flux2SplitTextStage> stage;
    try {
      stage.emplace(io::ModelDir(plan.sources), plan.text_slices, plan.text_encoder_layers, rank, dtype, device);
    } catch (const std::exception& e) {
      code = report(e);
    }
    code = env.agree(code);
    if (code != kExitOk) return code;
    try {
      encode_flux2_split(root.get(), *stage, env);
    } catch (const std::exception& e) {
      env.abort(report(e));
    }
    if (rank == 0) {
      log::info("encoded the prompts in ", seconds_text(seconds_since(t0)), " (", stage->describe(), ")");
      root->times.push_back({"encode", seconds_since(t0), stage_peak()});
    }
  }
  try {
    if (rank == 0) {
      encode_prompts(*root, device);
      if (root->prepared.inputs.encodes()) {
        const auto t0 = Clock::now();
        root->conditioning = encode_image_inputs(root->prepared, root->dtype, device);
        root->times.push_back({"encode images", seconds_since(t0), stage_peak()});
      }
      root->prepared.loras = LoraCheck{};  // unmapped: each rank reopens the LoRAs for its slice below
    }
    t_load = Clock::now();
    io::ModelDir dir(plan.sources);
    const bool flux2 = plan.family == "flux2";
    parallel::PlanRequest request;
    if (flux2) {
      request.transformer = io::transformer_shape(dir.flux2_transformer_config());
      request.family = parallel::flux2_family_costs(dir.flux2_transformer_config());
    } else {
      request.transformer = dir.transformer_config();
    }
    request.world_size = P;
    request.partition = plan.ranges;
    stages.emplace(parallel::StagePlan::make(request));
    const parallel::StageBlocks& b = stages->blocks(rank);
    nn::LoadStats stats;
    if (flux2) {
      part = load_flux2_stage(dir, b.first, b.last + 1, stages->owns_embedders(rank), stages->owns_final_layer(rank), dtype,
                              device, &stats);
    } else {
      flux::TransformerPart tp{b.first, b.last + 1, stages->owns_embedders(rank), stages->owns_final_layer(rank)};
      // Every rank opens the LoRAs itself and merges only the updates of the modules it loads.
      const LoraFiles loras = open_lora_files(plan.loras);
      auto applied = std::make_shared<std::vector<int64_t>>();
      nn::WeightAdjust merge;
      if (!loras.empty()) merge = flux::flux_lora_set(loras, dir.transformer_config()).adjust(applied);
      part = flux::load_flux_transformer(dir, tp, dtype, device, &stats, merge).ptr();
      for (size_t f = 0; f < loras.size(); ++f)
        log::debug("LoRA ", io::lora_spec_text(loras[f]->spec()), ": merged into ", (*applied)[f], " weights of blocks ",
                   b.describe());
    }
    log::debug("loaded blocks ", b.describe(), ": ", stats.tensors, " tensors, ", format_bytes(stats.bytes), " in ",
               seconds_text(seconds_since(t_load)));
  } catch (const std::exception& e) {
    code = report(e);
  }
  code = env.agree(code);
  if (code != kExitOk) return code;
  if (rank == 0) root->times.push_back({"load", seconds_since(t_load), stage_peak()});

  // Phase 3: the denoising loop. From here on a failure on any rank aborts the whole job.
  try {
    pipeline::DenoiseSetup setup;
    setup.steps = plan.steps;
    setup.text_tokens = plan.text_tokens;
    setup.latent_height = plan.latent_height;
    setup.latent_width = plan.latent_width;
    setup.reference_height = plan.reference_height;
    setup.reference_width = plan.reference_width;
    setup.passes = plan.passes;
    setup.patches = plan.patches;
    setup.warmup_steps = plan.warmup_steps;
    setup.groups = plan.groups;
    setup.dtype = dtype;
    setup.device = device;
    setup.fault = fault;
    std::unique_ptr<parallel::Messenger> messenger;
    if (P > 1) messenger = std::make_unique<parallel::Messenger>(env);

    if (rank != 0) {
      auto t0 = Clock::now();
      pipeline::denoise(setup, *part, *stages, rank, messenger.get(), nullptr);
      const double blocked = messenger->blocked_seconds();
      messenger.reset();
      log::debug(denoise_text(seconds_since(t0), blocked), "; peak RSS ", format_bytes(peak_rss_bytes()));
      if (helps_decode(plan, rank)) {
        part = nullptr;  // its blocks are done: the slice goes before the VAE decoder comes
        help_decode(plan, env, dtype, device);
      }
      return kExitOk;
    }

    PreparedRun& run = root->prepared;
    const RunConfig& c = run.config;
    std::optional<ckpt::CheckpointWriter> writer;
    const std::string& ckpt_path = c.checkpoint_file();
    if (run.resumed) writer.emplace(ckpt::CheckpointWriter::resume(ckpt_path, run.file, run.attributes));
    else if (!ckpt_path.empty()) writer.emplace(ckpt::CheckpointWriter::create(ckpt_path, run.file, run.attributes));

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
        if (!root->conditioning.empty()) cond[i] = root->conditioning[i].conditioning;
        if (flux2) latents[i] = flux2_initial_latents(run.images[i].seed, run.geometry, dtype);
        else latents[i] = cond[i].initial.defined() ? cond[i].initial
                                                    : pipeline::initial_latents(run.images[i].seed, run.geometry, dtype);
        text[i] = root->text[i].prompt_embeds;
        pooled[i] = root->text[i].pooled;
        if (plan.passes == 2) {
          neg_text[i] = root->negative[i].prompt_embeds;
          neg_pooled[i] = root->negative[i].pooled;
        }
        if (writer) {
          writer->write_text(static_cast<int64_t>(i), to_checkpoint(root->text[i], plan.passes == 2 ? &root->negative[i] : nullptr));
          const sched::Schedule cut = pipeline::cut_schedule(schedule, inputs.images[i].t_start);
          writer->write_schedule(static_cast<int64_t>(i), at::tensor(cut.timesteps), at::tensor(cut.sigmas));
          writer->write_initial(static_cast<int64_t>(i), latents[i][0]);
          if (!root->conditioning.empty())
            write_conditioning(*writer, static_cast<int64_t>(i), inputs.mode, root->conditioning[i]);
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
    root->text.clear();
    root->negative.clear();
    root->conditioning.clear();

    pipeline::RootState state;
    state.schedule = schedule;
    if (flux2) {
      state.guidance = plan.guidance;  // dev's guidance embedder; klein: none
      state.true_cfg_scale = *c.guidance;  // klein base: uncond + g (cond - uncond), as FLUX.1's true CFG
    } else {
      if (run.model->transformer_config().guidance_embeds) state.guidance = *c.guidance;
      state.true_cfg_scale = c.true_cfg;
    }
    int64_t total = 0;
    std::vector<pipeline::Conditioning> blends;  // inpaint: per group, [m, L, 4C] on the device
    for (const auto& g : plan.groups) {
      total += g.count * (plan.steps - g.start_step);
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
      if (inputs.mode == pipeline::PipelineMode::Inpaint) {
        pipeline::Conditioning b;
        b.image_latents = gather_cond(&pipeline::Conditioning::image_latents);
        b.noise = gather_cond(&pipeline::Conditioning::noise);
        b.mask = gather_cond(&pipeline::Conditioning::mask);
        blends.push_back(std::move(b));
      }
    }
    if (inputs.mode == pipeline::PipelineMode::Inpaint) {
      state.after_step = [&blends, &schedule](size_t gi, int64_t step, pipeline::TokenRange rows, const at::Tensor& x) {
        const pipeline::Conditioning& b = blends[gi];
        auto part = [&](const at::Tensor& t) { return t.narrow(1, rows.first, rows.count); };
        return pipeline::inpaint_blend(x, part(b.image_latents), part(b.noise), part(b.mask), schedule, step);
      };
    }
    if (inputs.mode != pipeline::PipelineMode::Text2Img) {
      std::string d = describe_inputs(inputs, *c.steps);
      d.pop_back();  // its newline
      log::info(d);
    }
    pipeline::Progress progress(total, !c.no_progress);
    std::vector<int64_t> t_start(n);
    for (size_t i = 0; i < n; ++i) t_start[i] = inputs.images[i].t_start;
    RootObserver observer(writer ? &*writer : nullptr, setup, c.checkpoint_every, progress, t_start);
    state.observer = &observer;
    auto t_denoise = Clock::now();
    pipeline::denoise(setup, *part, *stages, rank, messenger.get(), &state);
    if (messenger) log::debug(denoise_text(seconds_since(t_denoise), messenger->blocked_seconds()));
    messenger.reset();
    progress.finish();
    root->times.push_back({"denoise", seconds_since(t_denoise), stage_peak()});

    // Final latents of every image still to decode.
    for (size_t gi = 0; gi < plan.groups.size(); ++gi) {
      const auto& g = plan.groups[gi];
      for (int64_t j = 0; j < g.count; ++j) latents[static_cast<size_t>(g.first_image + j)] = state.groups[gi].latents[j].unsqueeze(0);
    }
    state.groups.clear();
    part = nullptr;  // stage-wise memory: the transformer slice goes before the VAE comes

    // Phase 4: decode, a microbatch of images per decoder call (one at a time with
    // --vae-slicing, in tiles with --vae-tiling or when the plan switched tiling on).
    auto t_decode = Clock::now();
    std::optional<vae::VaeDecoder> decoder;
    std::optional<Flux2Decoder> flux2_decoder;
    vae::DecodeOptions decode_options;
    decode_options.tiling = run.stages->vae_tiling();
    decode_options.slicing = c.vae_slicing;
    // Tiled: the tiles of each pass spread over the decode ranks, blended here.
    std::optional<pipeline::TileDecodeLeader> spread;
    if (plan.decode_ranks.size() > 1) {
      spread.emplace(env, plan.decode_ranks, dtype, device);
      decode_options.tiles = &*spread;
    }
    std::vector<size_t> batch;
    auto decode_batch = [&]() {
      if (batch.empty()) return;
      c10::InferenceMode guard;
      std::vector<at::Tensor> packed;
      for (size_t i : batch) packed.push_back(latents[i].to(device));
      std::vector<io::RgbImage> images;
      if (flux2) {
        if (!flux2_decoder) flux2_decoder.emplace(*run.model, dtype, device);
        images = flux2_decoder->decode(at::cat(packed, 0), run.geometry, decode_options);
      } else {
        if (!decoder) decoder.emplace(vae::load_vae_decoder(*run.model, dtype, device));
        images = vae::decode_images(*decoder, at::cat(packed, 0), run.geometry, run.model->vae_config(), decode_options);
      }
      for (size_t k = 0; k < batch.size(); ++k) {
        const size_t i = batch[k];
        io::write_png(run.images[i].output_path, images[k], png_text(run, i));
        if (writer) {
          writer->write_image(static_cast<int64_t>(i), images[k]);
          writer->set_status(static_cast<int64_t>(i), ckpt::ImageStatus::Decoded);
        }
        log::info("wrote ", run.images[i].output_path);
      }
      batch.clear();
    };
    for (size_t i = 0; i < n; ++i) {
      if (run.progress[i].decoded) continue;
      batch.push_back(i);
      if (static_cast<int64_t>(batch.size()) == c.microbatch) decode_batch();
    }
    decode_batch();
    if (spread) {
      spread->finish();
      log::debug("decoded ", spread->passes(), " tiled pass(es) over ranks ", ranks_text(plan.decode_ranks), ", ",
                 seconds_text(spread->blocked_seconds()), " waiting for the helpers' tiles");
    }
    if (decoder || flux2_decoder) root->times.push_back({"decode", seconds_since(t_decode), stage_peak()});
    if (writer) writer->close();
    print_summary(*root, seconds_since(start));
    return kExitOk;
  } catch (const std::exception& e) {
    env.abort(report(e));
  }
}

}  // namespace fluxmpi::app
