#include "app/runner.h"

#include <cstdio>
#include <map>
#include <memory>

#include "pipeline/flux2/stages.h"
#include "pipeline/flux1/image_stage.h"
#include "app/job_loop.h"
#include "app/prepare.h"
#include "app/root_run.h"
#include "core/log.h"
#include "core/units.h"
#include "parallel/device.h"
#include "parallel/message.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "models/flux/lora_targets.h"
#include "models/flux/transformer.h"
#include "pipeline/text_stage.h"

namespace fluxmpi::app {

using pipeline::encode_image_inputs;
using pipeline::Flux2SplitTextStage;
using pipeline::Flux2TextStage;
using pipeline::LoraCheck;
using pipeline::LoraFiles;
using pipeline::load_flux2_stage;
using pipeline::open_lora_files;
using pipeline::run_plan_from_json;
using pipeline::to_json;
namespace {

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

// Reports an error caught in a collective phase; returns its exit code.
int report(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) {
    log::report(*error);
    return error->exit_code();
  }
  log::report(InternalError(e.what()));
  return kExitFailure;
}

}  // namespace

int run_fluxmpi(const std::vector<std::string>& args, parallel::MpiEnv& env) {
  const auto start = Clock::now();
  const int rank = env.rank(), P = env.size();
  const std::vector<std::string> hosts = env.node_names();  // for --dry-run's pipelines

  // Phase 1: rank 0 validates; every rank learns the outcome.
  std::unique_ptr<RootRun> root;
  std::string message;  // JSON plan, or empty with an exit code
  int code = kExitOk;
  if (rank == 0) {
    try {
      Preparation prep = prepare_run(args, P, hosts);
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
    // Every pipeline runs the same plan of S slices: this rank's stage is its place in its pipeline.
    request.world_size = plan.stages;
    request.partition = plan.ranges;
    stages.emplace(parallel::StagePlan::make(request));
    const int stage = rank % plan.stages;
    const parallel::StageBlocks& b = stages->blocks(stage);
    nn::LoadStats stats;
    if (flux2) {
      part = load_flux2_stage(dir, b.first, b.last + 1, stages->owns_embedders(stage), stages->owns_final_layer(stage), dtype,
                              device, &stats);
    } else {
      flux::TransformerPart tp{b.first, b.last + 1, stages->owns_embedders(stage), stages->owns_final_layer(stage)};
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

  // Phases 3 and 4: the pipelines denoise, the leaders decode. From here on a failure on any rank
  // aborts the whole job.
  try {
    run_pipelines(plan, env, root.get(), part, *stages, dtype, device, fault, start);
    return kExitOk;
  } catch (const std::exception& e) {
    env.abort(report(e));
  }
}

}  // namespace fluxmpi::app
