#include "pipeline/flux2/family.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "models/common/attention.h"
#include "models/common/tensor_utils.h"
#include "parallel/text_split.h"
#include "models/flux2/vae_encoder.h"
#include "pipeline/flux2/checks.h"
#include "pipeline/flux2/multiref.h"
#include "pipeline/flux2/stages.h"
#include "pipeline/prepared_run.h"

namespace fluxmpi::pipeline {
namespace {

// The FLUX.2 defaults diffusers' examples and BFL recommend.
struct Flux2Defaults {
  int64_t steps;
  double guidance;
};

Flux2Defaults flux2_defaults(io::Flux2Kind kind) {
  // klein is step-distilled (4 steps, guidance unused); klein base and dev run 50 steps at
  // guidance 4 (BFL's recommendations, FLUX2-SOURCES.md).
  if (kind == io::Flux2Kind::Klein) return {4, 1.0};
  return {50, 4.0};
}

// Whether a FLUX.2 run takes two transformer passes per step (klein base with guidance > 1).
bool flux2_true_cfg(io::Flux2Kind kind, double guidance) { return kind == io::Flux2Kind::KleinBase && guidance > 1.0; }

// What FLUX.2 runs do not take (yet): one line naming the option.
void refuse_unsupported(const RunConfig& c, io::Flux2Kind kind) {
  const std::string what = flux2_model_name(kind);
  for (const char* option : {"mask", "control-image", "strength", "pipeline", "max-area", "no-auto-resize"})
    if (c.was_given(option))
      throw UsageError(str_cat("--", option, ": ", what, " takes reference images (--image, repeatable) and no other image "
                               "inputs in fluxmpi (masks, control images and strengths are FLUX.1's)"));
  for (const char* option : {"redux-model", "redux-image", "redux-prompt-scale", "redux-pooled-scale"})
    if (c.was_given(option))
      throw UsageError(str_cat("--", option, ": FLUX.1 Redux is an adapter of FLUX.1 models, not of ", what));
  if (c.was_given("prompt-2"))
    throw UsageError(str_cat("--prompt-2: ", what, " has one text encoder; give --prompt only"));
  if (c.was_given("negative-prompt") || c.was_given("true-cfg"))
    throw UsageError(str_cat("--", c.was_given("true-cfg") ? "true-cfg" : "negative-prompt", ": ", what,
                             " takes --guidance as diffusers' guidance_scale (klein base: true CFG with the empty "
                             "negative prompt when > 1); there is no separate negative prompt"));
  if (!c.loras.empty()) throw UsageError(str_cat("--lora: LoRAs are supported for FLUX.1 models only, not ", what));
  if (!c.controlnets.empty())
    throw UsageError(str_cat("--controlnet: FLUX ControlNets serve FLUX.1 models (FluxControlNetPipeline), not ", what));
  // The transformer may come from a single file (a GGUF or safetensors file in the original layout).
  for (const char* option : {"vae", "text-encoder", "text-encoder-2", "model-config"})
    if (c.was_given(option))
      throw UsageError(str_cat("--", option, ": ", what, " is read from its diffusers folder (--model DIR) only"));
}

// A JSON Lines line's inputs: FLUX.2 takes reference images ("image") only.
void refuse_image_lines(const std::vector<ImageJob>& jobs, io::Flux2Kind kind) {
  for (const ImageJob& j : jobs)
    if (!j.mask.empty() || !j.control_image.empty() || j.strength)
      throw UsageError(str_cat("prompts file: line ", j.line, ": ", flux2_model_name(kind),
                               " takes reference images (\"image\") and no mask, control image or strength"));
}

void resolve_flux2_defaults(RunConfig& c, const io::ModelDir& dir, const Flux2Shapes& shapes) {
  const io::Flux2Kind kind = dir.flux2_kind();
  const Flux2Defaults d = flux2_defaults(kind);
  if (!c.steps) c.steps = d.steps;
  if (!c.max_sequence_length) c.max_sequence_length = 512;
  if (kind == io::Flux2Kind::Klein) {
    if (c.guidance && c.was_given("guidance"))
      log::info("note: --guidance ", *c.guidance, " is ignored: ", flux2_model_name(kind),
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
  std::string s = str_cat("model: ", c.model, " (", flux2_model_name(dir.flux2_kind()), ")\n");
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

// World rank 0's side of a FLUX.2 run (Flux2Pipeline, Flux2KleinPipeline; pipeline/family.h): the
// same contract as FLUX.1's, for the second family. What differs (docs/flux2.md): one decoder-only
// text encoder whose hidden states of --text-encoder-layers are stacked; --guidance is diffusers'
// guidance_scale (dev: the guidance embedder; klein: ignored; klein base: true CFG with the empty
// negative prompt when > 1); the defaults of each model; no image inputs, LoRAs or single files
// (yet); the text encoder may be split over the leading ranks for stage 1.
class Flux2Root : public FamilyRoot {
 public:
  const Family& family() const override { return flux2_family(); }

  void resolve(PreparedRun& run, const ckpt::CheckpointReader* checkpoint) override {
    RunConfig& c = run.config;
    const io::ModelDir& dir = *run.model;
    refuse_unsupported(c, dir.flux2_kind());
    shapes_ = read_flux2_shapes(dir);
    // Multi-reference editing: --image (repeatable) or a JSON Lines "image" list; none: text-to-image.
    if (checkpoint) fill_references_from_checkpoint(c, checkpoint->attributes(0));
    run.inputs = resolve_references(c, dir, unit());
    resolve_flux2_defaults(c, dir, shapes_);
    cfg_ = flux2_true_cfg(dir.flux2_kind(), *c.guidance);
    run.geometry = flux::latent_geometry(*c.height, *c.width, shapes_.vae.scale_factor(), shapes_.transformer.latent_channels());
    check_patch_rows(c, run.geometry);
  }

  int passes(const PreparedRun&) const override { return cfg_ ? 2 : 1; }
  int64_t call_image_tokens(const PreparedRun& run) const override {
    int64_t tokens = run.geometry.tokens();  // + the reference tokens that follow them
    for (const LatentSize& r : reference_latents(run.inputs, shapes_.vae.scale_factor())) tokens += r.tokens();
    return tokens;
  }

  void check_job(PreparedRun& run) override {
    refuse_image_lines(run.images, run.model->flux2_kind());
    for (ImageJob& j : run.images) {
      j.prompt_2 = j.prompt;
      j.negative_prompt = "";  // klein base's CFG branch: diffusers' default negative prompt
    }
    check_job_references(run.inputs, run.images, run.config, *run.model, unit());
  }

  void complete_attributes(const PreparedRun& run, size_t image, ckpt::ImageAttributes& a) const override {
    a.family = "flux2";
    a.negative_prompt = "";
    a.true_cfg_scale = cfg_ ? *run.config.guidance : 1.0;
    set_reference_attributes(a, run.inputs, image);
  }

  void file_attributes(const PreparedRun& run, ckpt::FileAttributes& file) const override {
    const io::ModelDir& dir = *run.model;
    file.model_config = shapes_.transformer.json_text;
    file.vae_scale_factor = shapes_.vae.scale_factor();
    file.sources = {dir.source(io::Component::Transformer).path, dir.source(io::Component::Vae).path,
                    dir.source(io::Component::TextEncoder).path, "", dir.root(),
                    dir.source(io::Component::Transformer).quantization};
  }

  void check_weights(PreparedRun& run) override {
    const RunConfig& c = run.config;
    check_flux2_weights(*run.model, shapes_, c.text_encoder_layers, c.dry_run || run.any_encoding(), c.dry_run);
    if (run.inputs.encodes() && (c.dry_run || run.any_encoding())) flux2::check_vae_encoder(run.model->component_dir("vae"));
  }

  void plan(const PreparedRun& run, parallel::PlanRequest& request) override {
    const RunConfig& c = run.config;
    if (c.dry_run || run.any_encoding()) {
      parallel::LlmEncoderCosts llm;
      llm.shape = shapes_.text_encoder;
      llm.layers = *std::max_element(c.text_encoder_layers.begin(), c.text_encoder_layers.end());
      llm.final_norm = llm.layers == shapes_.text_encoder.num_hidden_layers;
      request.llm = llm;
    }
    request.vae = shapes_.vae;
    if (run.inputs.encodes() && (c.dry_run || run.any_encoding())) {
      // Rank 0's encode stage: the VAE encoder over one reference at a time, after the text encoder.
      encode_stage_ = reference_encode_stage(run.inputs, shapes_.vae, shapes_.vae_quant_conv, request.dtype_bytes,
                                             nn::kAttentionChunkBytes);
      request.image_encode_bytes = encode_stage_->total();
    }
    // The text encoder: on rank 0 when its budget holds it, else over the leading ranks for the
    // encoding stage (parallel/text_split.h), each slice freed before the ranks load their blocks.
    if (request.llm) {
      parallel::PlanRequest blocks = request;
      blocks.llm.reset();
      const uint64_t job_bytes = parallel::StagePlan::make(blocks).estimate(0).job_bytes;
      text_plan_ = parallel::plan_text_encoder(*request.llm, request.world_size, request.max_memory, request.dtype_bytes,
                                               request.text_tokens, job_bytes, request.attention_chunk_bytes);
      if (text_plan_->split()) request.llm.reset();  // rank 0's encode stage is its slice, not the whole encoder
    }
  }

  std::string dry_run_text(const PreparedRun& run, const parallel::PlanRequest& request) const override {
    std::string inputs;
    if (run.inputs.mode == PipelineMode::Multiref) inputs = inputs_text(run) + "\n";
    if (encode_stage_)
      inputs += str_cat("VAE encoder stage (rank 0, before its blocks load): weights ", format_bytes(encode_stage_->weight_bytes),
                        " + activations ", format_bytes(encode_stage_->activation_bytes), " = ",
                        format_bytes(encode_stage_->total()), "\n");
    return job_text(run.config, *run.model, run.geometry, request.images, cfg_, *run.stages) + inputs +
           (text_plan_ ? text_plan_->table() + "\n" : std::string()) + run.pipelines_text + run.stages->table();
  }

  void check_predictable(const PreparedRun&) const override {
    throw UsageError("--predict: the schedule model covers FLUX.1 jobs (tools/sim/README.md); this is a FLUX.2 model");
  }

  void complete_plan(const PreparedRun& run, RunPlan& plan) const override {
    const RunConfig& c = run.config;
    if (run.model->flux2_kind() == io::Flux2Kind::Dev) plan.guidance = *c.guidance;
    plan.text_encoder_layers = c.text_encoder_layers;
    plan.references = reference_latents(run.inputs, shapes_.vae.scale_factor());
    if (text_plan_ && text_plan_->split())
      for (const parallel::TextSlice& t : text_plan_->slices) plan.text_slices.push_back({t.first_layer, t.end_layer - 1});
  }

  // Stage 1 on rank 0 alone: one decoder-only encoder; klein base's true CFG encodes the empty prompt.
  PromptStage encode_prompts(const PreparedRun& run, at::ScalarType dtype, at::Device device,
                             PromptEmbeddings& out) override {
    Flux2TextStage encoder(*run.model, run.plan.text_encoder_layers, dtype, device);
    const int64_t msl = *run.config.max_sequence_length;
    PromptStage stage;
    stage.distinct = encode_job_prompts(
        run, run.plan.passes,
        [](const ImageJob& job, int pass) { return PromptKey{pass == 0 ? job.prompt : std::string(), ""}; },
        [&](const PromptKey& key, size_t i, int pass) {
          return encoder.encode(key.first, msl,
                                pass == 0 ? str_cat("image ", i) : str_cat("image ", i, " (the empty negative prompt)"));
        },
        out);
    stage.encoders = "text encoder";
    stage.parameter_bytes = encoder.parameter_bytes();
    return stage;
  }

  std::vector<EncodedImage> encode_images(const PreparedRun& run, at::ScalarType dtype, at::Device device) override {
    return encode_job_references(run, dtype, device);
  }

  std::string inputs_text(const PreparedRun& run) const override {
    if (run.inputs.mode != PipelineMode::Multiref) return "";
    return describe_references(run.inputs, flux2_model_name(run.model->flux2_kind()));
  }

  void sampling(const PreparedRun& run, const RunPlan& plan, RootState& state) const override {
    state.guidance = plan.guidance;  // dev's guidance embedder; klein: none
    state.true_cfg_scale = *run.config.guidance;  // klein base: uncond + g (cond - uncond), as FLUX.1's true CFG
  }

  ckpt::TextEmbeddings text_to_checkpoint(const PromptEmbedding& e, const PromptEmbedding* neg) const override {
    ckpt::TextEmbeddings t;
    t.prompt_embeds = e.prompt_embeds;
    t.input_ids = e.input_ids;
    t.attention_mask = e.attention_mask;
    if (neg != nullptr) {
      t.negative_prompt_embeds = neg->prompt_embeds;
      t.negative_input_ids = neg->input_ids;
      t.negative_attention_mask = neg->attention_mask;
    }
    return t;
  }

  // FLUX.2 has no pooled input.
  PromptEmbedding text_from_checkpoint(const ckpt::TextEmbeddings& stored, bool negative, at::ScalarType dtype) const override {
    PromptEmbedding e;
    e.prompt_embeds = (negative ? stored.negative_prompt_embeds : stored.prompt_embeds).to(dtype);
    return e;
  }

  void write_conditioning(ckpt::CheckpointWriter& writer, int64_t image, const PreparedRun& run,
                          const EncodedImage& encoded) const override {
    if (run.inputs.mode == PipelineMode::Multiref) write_references(writer, image, run.inputs, encoded, shapes_.vae.scale_factor());
  }

  Conditioning stored_conditioning(const ckpt::CheckpointReader& reader, int64_t image, const PreparedRun& run,
                                   at::ScalarType dtype) const override {
    return run.inputs.mode == PipelineMode::Multiref ? stored_references(reader, image, dtype) : Conditioning{};
  }

 private:
  int64_t unit() const { return 2 * shapes_.vae.scale_factor(); }  // pixels per token side

  Flux2Shapes shapes_;
  bool cfg_ = false;
  std::optional<parallel::TextSplitPlan> text_plan_;
  std::optional<parallel::EncodeStage> encode_stage_;
};

}  // namespace

std::unique_ptr<FamilyRoot> flux2_root() { return std::make_unique<Flux2Root>(); }

const char* flux2_model_name(io::Flux2Kind kind) {
  switch (kind) {
    case io::Flux2Kind::Dev: return "FLUX.2 [dev]";
    case io::Flux2Kind::Klein: return "FLUX.2 [klein]";
    case io::Flux2Kind::KleinBase: return "FLUX.2 [klein] base";
  }
  return "FLUX.2";
}

}  // namespace fluxmpi::pipeline
