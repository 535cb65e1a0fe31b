#include "app/prepare.h"

#include "app/defaults.h"
#include "app/model_sources.h"
#include "app/options.h"
#include "app/predict.h"
#include "core/log.h"
#include "models/common/attention.h"
#include "models/common/tensor_utils.h"
#include "parallel/pipelines.h"
#include "pipeline/family.h"

namespace fluxmpi::app {

using pipeline::check_unchanged_inputs;

bool keep_row(int64_t step, int64_t steps, int64_t every) { return (step + 1) % every == 0 || step == steps - 1; }

void fill_from_checkpoint(RunConfig& c, const ckpt::CheckpointReader& r) {
  FLUX_CHECK(r.num_images() > 0, "checkpoint without images");
  const ckpt::ImageAttributes& a = r.attributes(0);
  if (c.model.empty()) c.model = r.file().model;
  // The weights the checkpoint was made with, file by file, unless the command line names them.
  const ckpt::FileAttributes::Sources& s = r.file().sources;
  if (c.transformer.empty()) c.transformer = s.transformer;
  if (c.vae.empty()) c.vae = s.vae;
  if (c.text_encoder.empty()) c.text_encoder = s.text_encoder;
  if (c.text_encoder_2.empty()) c.text_encoder_2 = s.text_encoder_2;
  if (c.model_config.empty()) c.model_config = s.model_config;
  if (!c.was_given("height")) c.height = a.height;
  if (!c.was_given("width")) c.width = a.width;
  if (!c.was_given("steps")) c.steps = a.num_inference_steps;
  if (!c.was_given("guidance")) c.guidance = a.guidance_scale;
  if (!c.was_given("max-sequence-length")) c.max_sequence_length = a.max_sequence_length;
  if (!c.was_given("seed")) c.seed = a.seed;
  if (!c.was_given("dtype")) c.dtype = a.dtype;
  if (!c.was_given("lora")) c.loras = a.loras;
  if (!c.was_given("vae-tiling") && a.vae_tiling != 0) c.vae_tiling = true;
  if (!c.was_given("true-cfg") && !c.was_given("negative-prompt") && ckpt::uses_true_cfg(a)) {
    c.true_cfg = a.true_cfg_scale;
    c.negative_prompt = a.negative_prompt;
  }
  if (!c.was_given("prompt-2") && c.prompts.empty() && a.prompt_2 != a.prompt) c.prompt_2 = a.prompt_2;
  if (!c.was_given("patches")) c.patches = a.patches;
  if (!c.was_given("warmup-steps")) c.warmup_steps = a.warmup_steps;
}

ckpt::ImageAttributes attributes_of(const ImageJob& job, const RunConfig& c, const flux::LatentGeometry& g) {
  ckpt::ImageAttributes a;
  a.prompt = job.prompt;
  a.prompt_2 = job.prompt_2;
  a.negative_prompt = c.true_cfg_enabled() ? job.negative_prompt : "";
  a.seed = job.seed;
  a.height = g.height;
  a.width = g.width;
  a.num_inference_steps = *c.steps;
  a.guidance_scale = *c.guidance;
  // The effective scale: 1 when true CFG does not run (no negative prompt), as diffusers decides.
  a.true_cfg_scale = c.true_cfg_enabled() ? c.true_cfg : 1.0;
  a.max_sequence_length = *c.max_sequence_length;
  a.dtype = c.dtype;
  a.loras = c.loras;
  a.vae_tiling = 0;  // set once the plan has decided
  a.patches = c.patches;
  a.warmup_steps = c.warmup_steps;
  return a;
}

// The options omitted come from the checkpoint (filled in by fill_from_checkpoint), so that
// check_matches compares what the user asked for.
std::vector<ImageJob> jobs_from_checkpoint(const ckpt::CheckpointReader& r, const RunConfig& c) {
  std::vector<ImageJob> out;
  for (int64_t i = 0; i < r.num_images(); ++i) {
    const auto& a = r.attributes(i);
    ImageJob j;
    j.index = i;
    j.prompt = a.prompt;
    j.prompt_2 = c.was_given("prompt-2") ? c.prompt_2 : a.prompt_2;
    j.negative_prompt = c.negative_prompt ? *c.negative_prompt : a.negative_prompt;
    j.seed = *c.seed + i;
    j.output_path = image_output_path(c.output, i, r.num_images());
    // The inputs each image was made from, unless the command line names others.
    j.image = c.was_given("image") ? c.image : a.image.path;
    if (c.was_given("image")) {
      j.images = c.images;
    } else {
      for (const ckpt::ImageAttributes::Reference& r : a.references) j.images.push_back(r.input.path);
      if (j.images.empty() && !j.image.empty()) j.images = {j.image};
    }
    j.mask = c.was_given("mask") ? c.mask : a.mask.path;
    j.control_image = c.was_given("control-image") ? c.control_image : a.control_image.path;
    if (!c.was_given("strength") && pipeline::uses_strength(pipeline::parse_mode_name(a.pipeline).value_or(
                                         pipeline::PipelineMode::Text2Img)))
      j.strength = a.strength;
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<pipeline::WorkGroup> make_groups(const std::vector<ImageProgress>& progress, int64_t steps,
                                             int64_t microbatch) {
  std::vector<pipeline::WorkGroup> groups;
  for (int64_t i = 0; i < static_cast<int64_t>(progress.size()); ++i) {
    const ImageProgress& p = progress[static_cast<size_t>(i)];
    if (p.decoded || p.start_step >= steps) continue;
    if (!groups.empty()) {
      auto& last = groups.back();
      if (last.first_image + last.count == i && last.start_step == p.start_step && last.count < microbatch) {
        ++last.count;
        continue;
      }
    }
    groups.push_back({i, 1, p.start_step});
  }
  return groups;
}

void common_plan_request(const PreparedRun& run, int world_size, int passes, int64_t image_tokens,
                         parallel::PlanRequest& request) {
  const RunConfig& c = run.config;
  const int64_t inner_dim = request.transformer.inner_dim(), num_blocks = request.transformer.num_blocks();
  request.world_size = world_size;
  request.dtype_bytes = static_cast<int64_t>(c10::elementSize(nn::parse_dtype(c.dtype)));
  request.dtype_label = c.dtype;
  request.balance = parallel::parse_balance(c.balance);
  request.max_memory = parallel::parse_max_memory(c.max_memory, world_size);
  if (!c.partition.empty()) request.partition = parallel::parse_partition(c.partition, world_size, num_blocks);
  request.image_tokens = image_tokens;
  request.text_tokens = *c.max_sequence_length;
  request.microbatch = c.microbatch;
  request.keep_encoders = c.keep_encoders;
  request.attention_chunk_bytes = nn::kAttentionChunkBytes;
  // The images whose buffers rank 0 holds; a dry run counts the job it was given (1 prompt when none).
  const int64_t job = std::max<int64_t>(1, static_cast<int64_t>(c.prompts.size())) * c.num_images;
  request.images = std::max<int64_t>(1, c.dry_run ? job : static_cast<int64_t>(run.images.size()));
  request.passes = passes;
  request.latent_height = run.geometry.latent_height;
  request.latent_width = run.geometry.latent_width;
  request.vae_tiling = c.vae_tiling;
  request.vae_slicing = c.vae_slicing;
  if (c.patches > 1 && c.warmup_steps < *c.steps) {
    // Every image still to denoise keeps its buffers from its warm-up to its last step, and all
    // of them are in flight together; a dry run counts the job its options describe.
    int64_t images = c.dry_run ? job : 0;
    for (const ImageProgress& p : run.progress) images += !p.decoded && p.start_step < *c.steps ? 1 : 0;
    request.kv_cache_block_bytes = static_cast<uint64_t>(2 * (image_tokens + *c.max_sequence_length) * inner_dim *
                                                         request.dtype_bytes * passes * images);
  }
}

void make_stage_plan(PreparedRun& run, const parallel::PlanRequest& request, const ckpt::CheckpointReader* checkpoint) {
  run.stages.emplace(parallel::StagePlan::make(request));
  if (run.stages->vae_tiling_auto())
    log::info("--max-memory: rank 0's decode stage does not fit its budget untiled; decoding in VAE tiles (as --vae-tiling)");
  for (auto& a : run.attributes) a.vae_tiling = run.stages->vae_tiling() ? 1 : 0;
  // Whether tiling is used is known only now: the resumed file is compared once more.
  if (checkpoint)
    ckpt::check_matches(run.config.resume, checkpoint->file(), checkpoint->attributes(), run.file, run.attributes);
}

RunPlan common_run_plan(const PreparedRun& run, int world_size, int passes) {
  const RunConfig& c = run.config;
  RunPlan plan;
  plan.stages = world_size;
  plan.world_size = world_size;  // the job's, set by prepare_run
  plan.geometry = run.geometry;
  plan.vae_tiling = run.stages->vae_tiling();
  plan.vae_slicing = c.vae_slicing;
  plan.microbatch = c.microbatch;
  plan.checkpoint = !c.checkpoint_file().empty();
  plan.checkpoint_every = c.checkpoint_every;
  plan.model = c.model;
  plan.sources = run.model->sources();
  plan.dtype = c.dtype;
  plan.device = c.device;
  plan.threads = c.threads;
  plan.log_level = static_cast<int>(c.log_level);
  plan.steps = *c.steps;  // the full schedule: images with a strength start at their t_start
  plan.text_tokens = *c.max_sequence_length;
  plan.latent_height = run.geometry.latent_height;
  plan.latent_width = run.geometry.latent_width;
  plan.passes = passes;
  plan.patches = c.patches;
  plan.warmup_steps = c.warmup_steps;
  plan.groups = make_groups(run.progress, plan.steps, c.microbatch);
  for (int r = 0; r < world_size; ++r) plan.ranges.push_back({run.stages->blocks(r).first, run.stages->blocks(r).last});
  plan.decode_ranks = run.stages->decode_ranks();
  return plan;
}

namespace {

// prepare_run for one pipeline of `world_size` ranks: the one flow, with the model family's steps
// (pipeline/family.h) in between.
Preparation prepare_pipeline(PreparedRun run, int world_size) {
  Preparation out;
  RunConfig& c = run.config;
  log::set_level(c.log_level);

  std::optional<ckpt::CheckpointReader> checkpoint;
  if (!c.resume.empty()) {
    checkpoint.emplace(ckpt::CheckpointReader::open(c.resume));
    fill_from_checkpoint(c, *checkpoint);
    run.resumed = true;
  }
  if (c.dtype.empty()) c.dtype = "auto";
  resolve_dtype(c);  // after the checkpoint's dtype: a resumed run keeps it unless --dtype is given
  const at::ScalarType dtype = nn::parse_dtype(c.dtype);
  const at::Device device = c.device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  if (c.device == "cuda" && !at::hasCUDA())
    throw UsageError("--device cuda: this libtorch was built without CUDA (Debian's libtorch-dev is CPU-only)");
  if (!nn::dtype_supported(dtype, device))
    throw UsageError(str_cat("--dtype ", c.dtype, ": this libtorch cannot run ", c.dtype, " matmuls on the ",
                             c.device, " (use bf16 or fp32", c.device == "cpu" ? ", or --device cuda" : "", ")"));
  if (!c.dry_run && resolve_seed(c)) log::info("no --seed given: using seed ", *c.seed, " (pass --seed ", *c.seed, " to repeat)");

  run.model.emplace(model_sources_of(c));
  run.family = &pipeline::family_of(*run.model);
  run.family_root = run.family->root();
  pipeline::FamilyRoot& family = *run.family_root;
  const ckpt::CheckpointReader* stored = checkpoint ? &*checkpoint : nullptr;
  family.resolve(run, stored);
  if (c.patches > 1 && c.warmup_steps >= *c.steps)
    log::warn("--warmup-steps ", c.warmup_steps, " >= --steps ", *c.steps, ": every step runs exact, --patches ",
              c.patches, " changes nothing");

  // The job and where each image stands.
  if (!c.dry_run) {
    run.images = (checkpoint && c.prompts.empty()) ? jobs_from_checkpoint(*checkpoint, c) : build_job(c);
    family.check_job(run);
    for (size_t i = 0; i < run.images.size(); ++i) {
      run.attributes.push_back(attributes_of(run.images[i], c, run.geometry));
      family.complete_attributes(run, i, run.attributes.back());
    }
  }
  run.file.model = c.model;
  family.file_attributes(run, run.file);
  run.progress.assign(run.images.size(), ImageProgress{});
  for (size_t i = 0; i < run.images.size(); ++i) run.progress[i].start_step = run.inputs.images[i].t_start;
  if (checkpoint) {
    // Whether tiling is used is known once the plan is made; it is compared then.
    for (size_t i = 0; i < run.attributes.size() && i < checkpoint->attributes().size(); ++i)
      run.attributes[i].vae_tiling = checkpoint->attributes()[i].vae_tiling;
    ckpt::check_matches(c.resume, checkpoint->file(), checkpoint->attributes(), run.file, run.attributes);
    check_unchanged_inputs(*checkpoint, run.inputs);
    for (size_t i = 0; i < run.images.size(); ++i) {
      ckpt::ImageState s = checkpoint->state(static_cast<int64_t>(i));
      ImageProgress& p = run.progress[i];
      p.decoded = s.status == ckpt::ImageStatus::Decoded;
      p.needs_encoding = s.status == ckpt::ImageStatus::Encoding;
      // The loop runs the full schedule; an image with a strength starts at its t_start.
      p.start_step = run.inputs.images[i].t_start + (p.needs_encoding ? 0 : s.last_step + 1);
    }
    if (c.patches > 1) {
      for (size_t i = 0; i < run.progress.size(); ++i)
        if (const ImageProgress& p = run.progress[i];
            !p.decoded && p.start_step > run.inputs.images[i].t_start && p.start_step < *c.steps) {
          log::info("resuming a patch-pipelined run (--patches ", c.patches, "): each image runs ", c.warmup_steps,
                    " exact warm-up step(s) again from the step it resumes at, to refill the key/value buffers that "
                    "checkpoints do not store; the result is deterministic but not bit-identical to an uninterrupted run");
          break;
        }
    }
  }
  family.check_weights(run);

  const int passes = family.passes(run);
  parallel::PlanRequest request;
  run.family->plan_transformer(*run.model, request);
  common_plan_request(run, world_size, passes, family.call_image_tokens(run), request);
  family.plan(run, request);
  make_stage_plan(run, request, stored);

  if (c.dry_run) {
    out.output = family.dry_run_text(run, request);
    if (!c.predict.empty()) out.output += predict(predict_job(run, *run.stages, request.images, passes));
    out.dry_run_plan = run.stages;
    return out;
  }

  run.plan = common_run_plan(run, world_size, passes);
  run.plan.family = run.family->name();
  family.complete_plan(run, run.plan);
  out.run = std::move(run);
  return out;
}

}  // namespace

Preparation prepare_run(const std::vector<std::string>& args, int world_size, const std::vector<std::string>& hosts) {
  ParseResult parsed = parse_options(args);
  if (parsed.action != ParseResult::Action::Run) {
    Preparation out;
    out.output = parsed.text;
    return out;
  }
  PreparedRun run;
  run.config = parsed.config;
  const parallel::PipelineLayout layout = parallel::PipelineLayout::make(world_size, static_cast<int>(run.config.stages));
  if (run.config.stages != 0) run.pipelines_text = layout.table(hosts);
  run.world_size = world_size;
  Preparation out = prepare_pipeline(std::move(run), layout.stages());
  if (out.run) out.run->plan.world_size = world_size;
  return out;
}

}  // namespace fluxmpi::app
