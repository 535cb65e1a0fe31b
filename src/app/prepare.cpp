#include "app/prepare.h"

#include "app/defaults.h"
#include "pipeline/flux1/defaults.h"
#include "pipeline/flux1/image_inputs.h"
#include "app/flux2_prepare.h"
#include "app/model_sources.h"
#include "app/options.h"
#include "app/predict.h"
#include "core/log.h"
#include "core/units.h"
#include "models/common/attention.h"
#include "models/clip_text.h"
#include "models/common/tensor_utils.h"
#include "models/flux/transformer.h"
#include "models/common/loader.h"
#include "models/t5_encoder.h"
#include "models/vae/vae_decoder.h"
#include "models/vae/vae_encoder.h"
#include "parallel/encode_memory.h"
#include "parallel/pipelines.h"

namespace fluxmpi::app {

using pipeline::check_job_inputs;
using pipeline::check_loras;
using pipeline::check_unchanged_inputs;
using pipeline::describe_inputs;
using pipeline::fill_inputs_from_checkpoint;
using pipeline::lora_table;
using pipeline::resolve_defaults;
using pipeline::resolve_image_mode;
using pipeline::set_input_attributes;

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

namespace {

// --dry-run: every component's weight headers against its config, as a real run checks them
// before (VAE, transformer architecture) or while (text encoders, each rank's slice) it loads
// them, so a broken download fails here. Only headers are read; the modules are built without
// values, one transformer block at a time.
void check_all_components(const io::ModelDir& dir) {
  text_models::check_clip_text_weights(dir.clip_config(), dir.open_weights("text_encoder"));
  text_models::check_t5_encoder_weights(dir.t5_config(), dir.open_weights("text_encoder_2"));
  vae::check_vae_weights(dir);
  const io::TransformerConfig& tc = dir.transformer_config();
  io::TensorStore store = dir.open_weights("transformer");
  const int64_t B = tc.num_blocks();
  for (int64_t b = 0; b < B; ++b) {
    flux::FluxTransformer part(tc, flux::TransformerPart{b, b + 1, b == 0, b == B - 1});
    nn::LoadRules rules;
    rules.owned = [&part](const std::string& key) { return part->owns_key(key); };
    nn::check_module(*part, store, rules);
  }
}

// The --dry-run job line: what the run would make, above the plan.
std::string job_text(const RunConfig& c, const io::ModelDir& dir, const flux::LatentGeometry& g, int64_t images,
                     const parallel::StagePlan& plan) {
  const io::TransformerConfig& tc = dir.transformer_config();
  const size_t prompts = c.prompts.size();
  std::string s = str_cat("model: ", c.model, " (FLUX.1-", io::variant_name(dir.variant()), ")\n");
  s += str_cat("job: ", prompts == 0 ? std::string("no prompt given, counted as 1") : str_cat(prompts, " prompt", prompts == 1 ? "" : "s"),
               " x ", c.num_images, " image", c.num_images == 1 ? "" : "s", " = ", images, " image", images == 1 ? "" : "s",
               ", ", g.width, "x", g.height, " pixels (latent ", g.latent_width, "x", g.latent_height, ", ", g.tokens(),
               " image tokens), ", *c.steps, " steps");
  if (tc.guidance_embeds) s += str_cat(", guidance ", *c.guidance);
  if (c.true_cfg_enabled()) s += str_cat(", true CFG ", c.true_cfg, " (2 passes per step)");
  s += str_cat(", ", *c.max_sequence_length, " T5 tokens + 77 CLIP tokens, dtype ", c.dtype, ", microbatch ", c.microbatch);
  s += str_cat(", VAE ", plan.vae_tiling() ? "tiled" : "untiled", c.vae_slicing ? ", sliced" : "", "\n");
  return s;
}

}  // namespace

parallel::PlanRequest common_plan_request(const PreparedRun& run, int world_size, int passes, int64_t image_tokens,
                                          int64_t inner_dim, int64_t num_blocks) {
  const RunConfig& c = run.config;
  parallel::PlanRequest request;
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
    request.kv_cache_block_bytes = static_cast<uint64_t>(2 * (run.geometry.tokens() + *c.max_sequence_length) * inner_dim *
                                                         request.dtype_bytes * passes * images);
  }
  return request;
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

// prepare_run for one pipeline of `world_size` ranks.
Preparation prepare_pipeline(PreparedRun run, int world_size) {
  Preparation out;
  RunConfig& c = run.config;
  log::set_level(c.log_level);

  std::optional<ckpt::CheckpointReader> checkpoint;
  if (!c.resume.empty()) {
    checkpoint.emplace(ckpt::CheckpointReader::open(c.resume));
    fill_from_checkpoint(c, *checkpoint);
    fill_inputs_from_checkpoint(c, checkpoint->attributes(0), 2 * checkpoint->file().vae_scale_factor);
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
  if (run.model->family() == io::ModelFamily::Flux2) {
    run.resumed = checkpoint.has_value();
    return prepare_flux2_run(std::move(run), checkpoint ? &*checkpoint : nullptr, world_size);
  }
  const io::ModelDir& dir = *run.model;
  run.inputs = resolve_image_mode(c, dir);
  resolve_defaults(c, dir);
  const io::TransformerConfig& tc = dir.transformer_config();
  run.geometry = flux::latent_geometry(*c.height, *c.width, dir.vae_config().scale_factor(), tc.latent_channels());
  // Patches are runs of whole rows of image tokens.
  const int64_t token_rows = run.geometry.latent_height / 2;
  if (c.patches > token_rows)
    throw UsageError(str_cat("--patches ", c.patches, " exceeds the ", token_rows, " rows of image tokens of a ", run.geometry.width,
                             "x", run.geometry.height, " image (a patch is at least one row)"));
  const int64_t vae_scale = dir.vae_config().scale_factor();
  const int64_t reference_tokens = (run.inputs.condition.height / vae_scale / 2) * (run.inputs.condition.width / vae_scale / 2);
  if (c.patches > 1 && reference_tokens > 0)
    throw UsageError(str_cat("--patches ", c.patches, ": a Kontext job with an --image runs exact steps only (the ",
                             reference_tokens, " reference tokens attend with every patch; patch pipelining splits only "
                             "the output's tokens)"));
  if (c.patches > 1 && c.warmup_steps >= *c.steps)
    log::warn("--warmup-steps ", c.warmup_steps, " >= --steps ", *c.steps, ": every step runs exact, --patches ",
              c.patches, " changes nothing");

  // The job and where each image stands.
  if (!c.dry_run) {
    run.images = (checkpoint && c.prompts.empty()) ? jobs_from_checkpoint(*checkpoint, c) : build_job(c);
    check_job_inputs(run.inputs, run.images, c, dir);
    for (size_t i = 0; i < run.images.size(); ++i) {
      run.attributes.push_back(attributes_of(run.images[i], c, run.geometry));
      set_input_attributes(run.attributes.back(), run.inputs, i);
    }
  }
  run.file.model = c.model;
  run.file.model_config = tc.json_text;
  run.file.vae_scale_factor = dir.vae_config().scale_factor();
  run.file.sources = {dir.source(io::Component::Transformer).path, dir.source(io::Component::Vae).path,
                      dir.source(io::Component::TextEncoder).path, dir.source(io::Component::TextEncoder2).path,
                      dir.root()};
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

  dir.check_consistency(/*with_text=*/c.dry_run || run.any_encoding());
  if (!c.dry_run) {
    dir.require(io::Component::Vae);
    if (run.any_encoding()) {
      dir.require(io::Component::TextEncoder);
      dir.require(io::Component::TextEncoder2);
    }
  }
  {
    io::TensorStore store = dir.open_weights("transformer");
    dir.check_transformer_weights(store);
  }
  if (c.dry_run) check_all_components(dir);
  else vae::check_vae_weights(dir);
  if (run.inputs.encodes() && (c.dry_run || run.any_encoding())) vae::check_vae_encoder_weights(dir);
  run.loras = check_loras(c.loras, dir, /*with_text=*/c.dry_run || run.any_encoding());

  parallel::PlanRequest request = common_plan_request(run, world_size, c.true_cfg_enabled() ? 2 : 1,
                                                     run.geometry.tokens() + reference_tokens,  // Kontext: + the reference
                                                     tc.inner_dim(), tc.num_blocks());
  request.transformer = tc;
  if (c.dry_run || run.any_encoding()) {
    request.clip = dir.clip_config();
    request.t5 = dir.t5_config();
  }
  request.vae = dir.vae_config();
  std::optional<parallel::EncodeStage> encode_stage;
  if (run.inputs.encodes() && (c.dry_run || run.any_encoding())) {
    // Rank 0's encode stage: one input at a time, at the size it is encoded at.
    const bool qc = vae::parse_vae_encoder_config(dir.read_config("vae/config.json")).use_quant_conv;
    const bool kontext = run.inputs.mode == pipeline::PipelineMode::Kontext;
    encode_stage = parallel::vae_encode_stage(dir.vae_config(), qc, kontext ? run.inputs.condition.height : run.geometry.height,
                                              kontext ? run.inputs.condition.width : run.geometry.width, request.dtype_bytes,
                                              nn::kAttentionChunkBytes);
    request.image_encode_bytes = encode_stage->total();
  }
  make_stage_plan(run, request, checkpoint ? &*checkpoint : nullptr);

  if (c.dry_run) {
    std::string encode;
    if (encode_stage)
      encode = str_cat("VAE encoder stage (rank 0, before its blocks load): weights ", format_bytes(encode_stage->weight_bytes),
                       " + activations ", format_bytes(encode_stage->activation_bytes), " = ",
                       format_bytes(encode_stage->total()), "\n");
    out.output = job_text(c, dir, run.geometry, request.images, *run.stages) + describe_inputs(run.inputs, *c.steps) + encode +
                 dir.describe_sources() + run.pipelines_text +
                 run.stages->table() + lora_table(run.loras, *run.stages);
    if (!c.predict.empty())
      out.output += predict(predict_job(run, *run.stages, request.images, c.true_cfg_enabled() ? 2 : 1));
    out.dry_run_plan = run.stages;
    return out;
  }

  RunPlan& plan = run.plan;
  plan = common_run_plan(run, world_size, c.true_cfg_enabled() ? 2 : 1);
  plan.reference_height = run.inputs.condition.height / vae_scale;
  plan.reference_width = run.inputs.condition.width / vae_scale;
  plan.loras = c.loras;
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
