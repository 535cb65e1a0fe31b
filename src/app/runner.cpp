#include "app/runner.h"

#include <cstdio>
#include <memory>

#include "app/job_loop.h"
#include "app/prepare.h"
#include "app/root_run.h"
#include "core/log.h"
#include "core/units.h"
#include "models/common/block_reuse.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "parallel/device.h"
#include "pipeline/family.h"

namespace fluxmpi::app {

using pipeline::run_plan_from_json;
using pipeline::to_json;

namespace {

// Stage 1 on rank 0: each distinct prompt once, with the encoders freed afterwards (unless the
// plan split the text encoder over the ranks, which encoded the prompts already).
void encode_prompts(RootRun& root, const pipeline::RunPlan& plan, at::Device device) {
  PreparedRun& run = root.prepared;
  if (!run.any_encoding() || !plan.text_slices.empty()) return;
  auto t0 = Clock::now();
  const pipeline::PromptStage stage = run.family_root->encode_prompts(run, root.dtype, device, root.prompts);
  log::info("encoded ", stage.distinct, " distinct prompt(s) in ", seconds_text(seconds_since(t0)), " (", stage.encoders,
            ": ", format_bytes(static_cast<uint64_t>(stage.parameter_bytes)), ")");
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
  std::unique_ptr<pipeline::ResidualSource> control;  // a pipeline leader's ControlNets (none without)
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
    // The text encoder over the leading ranks: all of them load their slices and agree, then
    // encode together (a failure from here on aborts the job, as in the denoising loop).
    code = env.agree(code);
    if (code != kExitOk) return code;
    const auto t0 = Clock::now();
    std::unique_ptr<pipeline::SplitTextStage> stage;
    try {
      stage = pipeline::family_named(plan.family).split_text_stage(io::ModelDir(plan.sources), plan, rank, dtype, device);
    } catch (const std::exception& e) {
      code = report(e);
    }
    code = env.agree(code);
    if (code != kExitOk) return code;
    try {
      nn::ReuseLargeBlocks reuse;  // the encoder's activations (models/common/block_reuse.h)
      stage->encode(env, root ? &root->prepared : nullptr, root ? &root->prompts : nullptr);
    } catch (const std::exception& e) {
      env.abort(report(e));
    }
    if (rank == 0) {
      log::info("encoded the prompts in ", seconds_text(seconds_since(t0)), " (", stage->describe(), ")");
      root->times.push_back({"encode", seconds_since(t0), stage_peak()});
    }
  }
  try {
    const pipeline::Family& family = pipeline::family_named(plan.family);
    if (rank == 0) {
      nn::ReuseLargeBlocks reuse;  // the encoders' activations (models/common/block_reuse.h)
      PreparedRun& run = root->prepared;
      encode_prompts(*root, plan, device);
      if (run.inputs.encodes()) {
        const auto t0 = Clock::now();
        root->conditioning = run.family_root->encode_images(run, root->dtype, device);
        root->times.push_back({"encode images", seconds_since(t0), stage_peak()});
      }
      run.family_root->end_stage1();
    }
    t_load = Clock::now();
    io::ModelDir dir(plan.sources);
    parallel::PlanRequest request;
    family.plan_transformer(dir, request);
    // Every pipeline runs the same plan of S slices: this rank's stage is its place in its pipeline.
    request.world_size = plan.stages;
    request.partition = plan.ranges;
    stages.emplace(parallel::StagePlan::make(request));
    const int stage = rank % plan.stages;
    const parallel::StageBlocks& b = stages->blocks(stage);
    nn::LoadStats stats;
    part = family.load_part(dir, plan, *stages, stage, dtype, device, &stats);
    log::debug("loaded blocks ", b.describe(), ": ", stats.tensors, " tensors, ", format_bytes(stats.bytes), " in ",
               seconds_text(seconds_since(t_load)), "; peak RSS so far ", format_bytes(peak_rss_bytes()));
    if (stage == 0) control = family.residual_source(plan, dtype, device);
  } catch (const std::exception& e) {
    code = report(e);
  }
  code = env.agree(code);
  if (code != kExitOk) return code;
  if (rank == 0) root->times.push_back({"load", seconds_since(t_load), stage_peak()});

  // Phases 3 and 4: the pipelines denoise, the leaders decode. From here on a failure on any rank
  // aborts the whole job.
  try {
    nn::ReuseLargeBlocks reuse;  // each step's activations, then the decoder's (models/common/block_reuse.h)
    run_pipelines(plan, env, root.get(), part, control, *stages, dtype, device, fault, start);
    return kExitOk;
  } catch (const std::exception& e) {
    env.abort(report(e));
  }
}

}  // namespace fluxmpi::app
