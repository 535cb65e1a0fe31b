#include "app/flux2_prepare.h"

#include <algorithm>

#include "app/defaults.h"
#include "pipeline/flux2/checks.h"
#include "app/predict.h"
#include "core/log.h"
#include "core/units.h"
#include "parallel/text_split.h"
#include "models/common/attention.h"
#include "models/common/tensor_utils.h"

namespace fluxmpi::app {

using pipeline::check_flux2_weights;
using pipeline::check_text_encoder_layers;
using pipeline::Flux2Shapes;
using pipeline::ImageSources;
using pipeline::kDefaultImageSize;
using pipeline::read_flux2_shapes;

Flux2Defaults flux2_defaults(io::Flux2Kind kind) {
  // klein is step-distilled (4 steps, guidance unused); klein base and dev run 50 steps at
  // guidance 4 (BFL's recommendations, FLUX2-SOURCES.md).
  if (kind == io::Flux2Kind::Klein) return {4, 1.0};
  return {50, 4.0};
}

bool flux2_true_cfg(io::Flux2Kind kind, double guidance) { return kind == io::Flux2Kind::KleinBase && guidance > 1.0; }

namespace {

const char* model_name(io::Flux2Kind kind) {
  switch (kind) {
    case io::Flux2Kind::Dev: return "FLUX.2 [dev]";
    case io::Flux2Kind::Klein: return "FLUX.2 [klein]";
    case io::Flux2Kind::KleinBase: return "FLUX.2 [klein] base";
  }
  return "FLUX.2";
}

// What FLUX.2 runs do not take (yet): one line naming the option.
void refuse_unsupported(const RunConfig& c, io::Flux2Kind kind) {
  const std::string what = model_name(kind);
  for (const char* option : {"image", "mask", "control-image", "strength", "pipeline", "max-area", "no-auto-resize"})
    if (c.was_given(option))
      throw UsageError(str_cat("--", option, ": ", what, " runs text-to-image only in fluxmpi (image inputs are FLUX.1's)"));
  if (c.was_given("prompt-2"))
    throw UsageError(str_cat("--prompt-2: ", what, " has one text encoder; give --prompt only"));
  if (c.was_given("negative-prompt") || c.was_given("true-cfg"))
    throw UsageError(str_cat("--", c.was_given("true-cfg") ? "true-cfg" : "negative-prompt", ": ", what,
                             " takes --guidance as diffusers' guidance_scale (klein base: true CFG with the empty "
                             "negative prompt when > 1); there is no separate negative prompt"));
  if (!c.loras.empty()) throw UsageError(str_cat("--lora: LoRAs are supported for FLUX.1 models only, not ", what));
  for (const char* option : {"transformer", "vae", "text-encoder", "text-encoder-2", "model-config"})
    if (c.was_given(option))
      throw UsageError(str_cat("--", option, ": ", what, " is read from its diffusers folder (--model DIR) only"));
}

// Image ids per JSON Lines line: FLUX.2 takes plain prompts.
void refuse_image_lines(const std::vector<ImageJob>& jobs, io::Flux2Kind kind) {
  for (const ImageJob& j : jobs)
    if (!j.image.empty() || !j.mask.empty() || !j.control_image.empty() || j.strength)
      throw UsageError(str_cat("prompts file: line ", j.line, ": ", model_name(kind),
                               " runs text-to-image only (image inputs are FLUX.1's)"));
}

void resolve_flux2_defaults(RunConfig& c, const io::ModelDir& dir, const Flux2Shapes& shapes) {
  const io::Flux2Kind kind = dir.flux2_kind();
  const Flux2Defaults d = flux2_defaults(kind);
  if (!c.steps) c.steps = d.steps;
  if (!c.max_sequence_length) c.max_sequence_length = 512;
  if (kind == io::Flux2Kind::Klein) {
    if (c.guidance && c.was_given("guidance"))
      log::info("note: --guidance ", *c.guidance, " is ignored: ", model_name(kind),
                " is step-distilled (diffusers ignores guidance_scale for it too)");
    c.guidance = 0.0;
  } else if (!c.guidance) {
    c.guidance = d.guidance;
  }
  if (c.text_encoder_layers.empty()) c.text_encoder_layers = io::default_text_encoder_layers(kind);
  check_text_encoder_layers(c.text_encoder_layers, dir, shapes);

  const int64_t requested_height = c.height.value_or(kDefaultImageSize);
  const int64_t requested_width = c.width.value_or(kDefaultImageSize);
  const int64_t scale = shapes.vae.scale_factor();
  const flux::LatentGeometry g = flux::latent_geometry(requested_height, requested_width, scale, shapes.transformer.latent_channels());
  if (flux::is_empty(g))
    throw UsageError(str_cat(g.latent_height == 0 ? "--height " : "--width ", g.latent_height == 0 ? requested_height : requested_width,
                             " is smaller than ", 2 * scale, " (2 x the VAE scale factor ", scale, " of ",
                             dir.label("vae/config.json"), "): the image would be empty"));
  if (g.height != requested_height || g.width != requested_width)
    log::warn("--height and --width must be multiples of ", 2 * scale, " for this model (2 x the VAE scale factor): ",
              requested_height, "x", requested_width, " (height x width) is floored to ", g.height, "x", g.width);
  c.height = g.height;
  c.width = g.width;
}

std::string layers_text(const std::vector<int64_t>& layers) {
  std::string s;
  for (int64_t l : layers) s += str_cat(s.empty() ? "" : ",", l);
  return s;
}

// The --dry-run job line.
std::string job_text(const RunConfig& c, const io::ModelDir& dir, const flux::LatentGeometry& g, int64_t images, bool cfg,
                     const parallel::StagePlan& plan) {
  const size_t prompts = c.prompts.size();
  std::string s = str_cat("model: ", c.model, " (", model_name(dir.flux2_kind()), ")\n");
  s += str_cat("job: ", prompts == 0 ? std::string("no prompt given, counted as 1") : str_cat(prompts, " prompt", prompts == 1 ? "" : "s"),
               " x ", c.num_images, " image", c.num_images == 1 ? "" : "s", " = ", images, " image", images == 1 ? "" : "s",
               ", ", g.width, "x", g.height, " pixels (latent ", g.latent_width, "x", g.latent_height, ", ", g.tokens(),
               " image tokens), ", *c.steps, " steps");
  if (dir.flux2_kind() == io::Flux2Kind::Dev) s += str_cat(", guidance ", *c.guidance);
  if (cfg) s += str_cat(", true CFG ", *c.guidance, " with the empty negative prompt (2 passes per step)");
  s += str_cat(", ", *c.max_sequence_length, " text tokens (hidden states of layers ", layers_text(c.text_encoder_layers),
               "), dtype ", c.dtype, ", microbatch ", c.microbatch);
  s += str_cat(", VAE ", plan.vae_tiling() ? "tiled" : "untiled", c.vae_slicing ? ", sliced" : "", "\n");
  s += str_cat("transformer:    ", dir.source(io::Component::Transformer).describe(), "\n");
  s += str_cat("vae:            ", dir.source(io::Component::Vae).describe(), "\n");
  s += str_cat("text_encoder:   ", dir.source(io::Component::TextEncoder).describe(), "\n");
  return s;
}

}  // namespace

Preparation prepare_flux2_run(PreparedRun run, const ckpt::CheckpointReader* checkpoint, int world_size) {
  Preparation out;
  RunConfig& c = run.config;
  const io::ModelDir& dir = *run.model;
  const io::Flux2Kind kind = dir.flux2_kind();
  refuse_unsupported(c, kind);
  const Flux2Shapes shapes = read_flux2_shapes(dir);
  resolve_flux2_defaults(c, dir, shapes);
  const bool cfg = flux2_true_cfg(kind, *c.guidance);
  run.geometry = flux::latent_geometry(*c.height, *c.width, shapes.vae.scale_factor(), shapes.transformer.latent_channels());
  const int64_t token_rows = run.geometry.latent_height / 2;
  if (c.patches > token_rows)
    throw UsageError(str_cat("--patches ", c.patches, " exceeds the ", token_rows, " rows of image tokens of a ", run.geometry.width,
                             "x", run.geometry.height, " image (a patch is at least one row)"));

  if (!c.dry_run) {
    run.images = (checkpoint && c.prompts.empty()) ? jobs_from_checkpoint(*checkpoint, c) : build_job(c);
    refuse_image_lines(run.images, kind);
    for (ImageJob& j : run.images) {
      j.prompt_2 = j.prompt;
      j.negative_prompt = "";  // klein base's CFG branch: diffusers' default negative prompt
      ckpt::ImageAttributes a = attributes_of(j, c, run.geometry);
      a.family = "flux2";
      a.negative_prompt = "";
      a.true_cfg_scale = cfg ? *c.guidance : 1.0;
      run.attributes.push_back(std::move(a));
    }
  }
  run.file.model = c.model;
  run.file.model_config = shapes.transformer.json_text;
  run.file.vae_scale_factor = shapes.vae.scale_factor();
  run.file.sources = {dir.source(io::Component::Transformer).path, dir.source(io::Component::Vae).path,
                      dir.source(io::Component::TextEncoder).path, "", dir.root()};
  run.inputs = JobInputs{};  // text-to-image: no image of the job has inputs
  run.inputs.images.assign(run.images.size(), ImageSources{});
  run.progress.assign(run.images.size(), ImageProgress{});
  if (checkpoint) {
    for (size_t i = 0; i < run.attributes.size() && i < checkpoint->attributes().size(); ++i)
      run.attributes[i].vae_tiling = checkpoint->attributes()[i].vae_tiling;
    ckpt::check_matches(c.resume, checkpoint->file(), checkpoint->attributes(), run.file, run.attributes);
    for (size_t i = 0; i < run.images.size(); ++i) {
      const ckpt::ImageState s = checkpoint->state(static_cast<int64_t>(i));
      ImageProgress& p = run.progress[i];
      p.decoded = s.status == ckpt::ImageStatus::Decoded;
      p.needs_encoding = s.status == ckpt::ImageStatus::Encoding;
      p.start_step = p.needs_encoding ? 0 : s.last_step + 1;
    }
  }
  const bool encodes = c.dry_run || run.any_encoding();
  check_flux2_weights(dir, shapes, c.text_encoder_layers, encodes, c.dry_run);

  parallel::PlanRequest request = common_plan_request(run, world_size, cfg ? 2 : 1, run.geometry.tokens(),
                                                     shapes.transformer.inner_dim(), shapes.transformer.num_blocks());
  request.transformer = io::transformer_shape(shapes.transformer);
  request.family = parallel::flux2_family_costs(shapes.transformer);
  if (encodes) {
    parallel::LlmEncoderCosts llm;
    llm.shape = shapes.text_encoder;
    llm.layers = *std::max_element(c.text_encoder_layers.begin(), c.text_encoder_layers.end());
    llm.final_norm = llm.layers == shapes.text_encoder.num_hidden_layers;
    request.llm = llm;
  }
  request.vae = shapes.vae;
  // The text encoder: on rank 0 when its budget holds it, else over the leading ranks for the
  // encoding stage (parallel/text_split.h), each slice freed before the ranks load their blocks.
  std::optional<parallel::TextSplitPlan> text_plan;
  if (request.llm) {
    parallel::PlanRequest blocks = request;
    blocks.llm.reset();
    const uint64_t job_bytes = parallel::StagePlan::make(blocks).estimate(0).job_bytes;
    text_plan = parallel::plan_text_encoder(*request.llm, world_size, request.max_memory, request.dtype_bytes,
                                            request.text_tokens, job_bytes, request.attention_chunk_bytes);
    if (text_plan->split()) request.llm.reset();  // rank 0's encode stage is its slice, not the whole encoder
  }
  make_stage_plan(run, request, checkpoint);

  if (c.dry_run) {
    if (!c.predict.empty()) predict_job(run, *run.stages, request.images, cfg ? 2 : 1);  // a UsageError: not modelled
    out.output = job_text(c, dir, run.geometry, request.images, cfg, *run.stages) +
                 (text_plan ? text_plan->table() + "\n" : std::string()) + run.pipelines_text + run.stages->table();
    out.dry_run_plan = run.stages;
    return out;
  }

  RunPlan& plan = run.plan;
  plan = common_run_plan(run, world_size, cfg ? 2 : 1);
  plan.family = "flux2";
  if (kind == io::Flux2Kind::Dev) plan.guidance = *c.guidance;
  plan.text_encoder_layers = c.text_encoder_layers;
  if (text_plan && text_plan->split())
    for (const parallel::TextSlice& t : text_plan->slices) plan.text_slices.push_back({t.first_layer, t.end_layer - 1});
  out.run = std::move(run);
  return out;
}

}  // namespace fluxmpi::app
