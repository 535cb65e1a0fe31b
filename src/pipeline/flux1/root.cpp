#include "pipeline/flux1/family.h"

#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "models/clip_text.h"
#include "models/common/attention.h"
#include "models/common/loader.h"
#include "models/flux/transformer.h"
#include "models/t5_encoder.h"
#include "models/vae/vae_decoder.h"
#include "models/vae/vae_encoder.h"
#include "parallel/encode_memory.h"
#include "models/flux/controlnet.h"
#include "pipeline/flux1/controlnet_mode.h"
#include "pipeline/flux1/defaults.h"
#include "pipeline/flux1/image_inputs.h"
#include "pipeline/flux1/image_stage.h"
#include "pipeline/flux1/loras.h"
#include "pipeline/flux1/redux.h"
#include "pipeline/prepared_run.h"
#include "pipeline/text_stage.h"

namespace fluxmpi::pipeline {
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

// Several --image (or a JSON Lines "image" list) are a FLUX.2 model's reference images.
void refuse_reference_lists(const RunConfig& c) {
  const char* why = ": several reference images are for FLUX.2 models (Flux2Pipeline); a FLUX.1 model takes one image";
  if (c.images.size() > 1) throw UsageError(str_cat("--image is given ", c.images.size(), " times", why));
  for (const PromptInputs& e : c.prompt_inputs)
    if (e.images.size() > 1)
      throw UsageError(str_cat("prompts file '", c.prompts_file, "': line ", e.line, ": \"image\" lists ", e.images.size(),
                               " images", why));
}

// World rank 0's side of a FLUX.1 run (pipeline/family.h): what validation keeps for the later steps (the LoRAs it
// checked, rank 0's VAE encode stage, Kontext's reference tokens) and, with --keep-encoders, the
// text encoders after stage 1.
class Flux1Root : public FamilyRoot {
 public:
  const Family& family() const override { return flux1_family(); }

  void resolve(PreparedRun& run, const ckpt::CheckpointReader* checkpoint) override {
    RunConfig& c = run.config;
    if (checkpoint) {
      fill_inputs_from_checkpoint(c, checkpoint->attributes(0), 2 * checkpoint->file().vae_scale_factor);
      fill_controlnets_from_checkpoint(c, checkpoint->attributes(0));
    }
    redux_ = ReduxJob::resolve(c, checkpoint);  // before the defaults: Redux's sequence length is 512
    if (redux_ && checkpoint) redux_->check_unchanged(*checkpoint);
    const io::ModelDir& dir = *run.model;
    refuse_reference_lists(c);
    run.inputs = resolve_image_mode(c, dir);
    if (run.inputs.mode == PipelineMode::ControlNet) controlnet_ = resolve_controlnet_job(c, dir, run.inputs);
    else if (!c.control_modes.empty() || !c.controlnet_scales.empty() || !c.control_guidance_starts.empty() ||
             !c.control_guidance_ends.empty())
      resolve_controlnets({{}, {}, c.control_modes, c.controlnet_scales, c.control_guidance_starts, c.control_guidance_ends},
                          dir.transformer_config(), dir.vae_config().scale_factor());  // throws: no --controlnet
    resolve_defaults(c, dir);
    const io::TransformerConfig& tc = dir.transformer_config();
    run.geometry = flux::latent_geometry(*c.height, *c.width, dir.vae_config().scale_factor(), tc.latent_channels());
    check_patch_rows(c, run.geometry);
    const int64_t vae_scale = dir.vae_config().scale_factor();
    reference_tokens_ = (run.inputs.condition.height / vae_scale / 2) * (run.inputs.condition.width / vae_scale / 2);
    if (c.patches > 1 && reference_tokens_ > 0)
      throw UsageError(str_cat("--patches ", c.patches, ": a Kontext job with an --image runs exact steps only (the ",
                               reference_tokens_, " reference tokens attend with every patch; patch pipelining splits only "
                               "the output's tokens)"));
  }

  int passes(const PreparedRun& run) const override { return run.config.true_cfg_enabled() ? 2 : 1; }

  int64_t call_image_tokens(const PreparedRun& run) const override {
    return run.geometry.tokens() + reference_tokens_;  // Kontext: + the reference
  }

  void check_job(PreparedRun& run) override { check_job_inputs(run.inputs, run.images, run.config, *run.model); }

  void complete_attributes(const PreparedRun& run, size_t image, ckpt::ImageAttributes& a) const override {
    set_input_attributes(a, run.inputs, image);
    if (redux_) a.redux = redux_->attributes();
    if (controlnet_) set_controlnet_attributes(a, *controlnet_, run.inputs);
  }

  void file_attributes(const PreparedRun& run, ckpt::FileAttributes& file) const override {
    const io::ModelDir& dir = *run.model;
    file.model_config = dir.transformer_config().json_text;
    file.vae_scale_factor = dir.vae_config().scale_factor();
    file.sources = {dir.source(io::Component::Transformer).path, dir.source(io::Component::Vae).path,
                    dir.source(io::Component::TextEncoder).path, dir.source(io::Component::TextEncoder2).path,
                    dir.root(), dir.source(io::Component::Transformer).quantization};
  }

  void check_weights(PreparedRun& run) override {
    const RunConfig& c = run.config;
    const io::ModelDir& dir = *run.model;
    dir.check_consistency(/*with_text=*/needs_text(run));
    if (!c.dry_run) {
      dir.require(io::Component::Vae);
      if (encodes_text(run)) {
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
    if (run.inputs.encodes() && !run.inputs.controlnet_pixels && (c.dry_run || run.any_encoding()))
      vae::check_vae_encoder_weights(dir);
    if (redux_ && (c.dry_run || run.any_encoding())) redux_->check_weights(dir);
    if (controlnet_)
      for (const std::string& net : controlnet_->nets) flux::check_controlnet_weights(net);
    loras_ = check_loras(c.loras, dir, /*with_text=*/needs_text(run));
  }

  void plan(const PreparedRun& run, parallel::PlanRequest& request) override {
    const RunConfig& c = run.config;
    const io::ModelDir& dir = *run.model;
    if (needs_text(run)) {
      request.clip = dir.clip_config();
      request.t5 = dir.t5_config();
    }
    if (redux_) redux_->plan(request, c.dry_run || run.any_encoding());
    request.vae = dir.vae_config();
    if (controlnet_) request.controlnet = controlnet_request(*controlnet_);
    if (run.inputs.encodes() && !run.inputs.controlnet_pixels && (c.dry_run || run.any_encoding())) {
      // Rank 0's encode stage: one input at a time, at the size it is encoded at.
      const bool qc = vae::parse_vae_encoder_config(dir.read_config("vae/config.json")).use_quant_conv;
      const bool kontext = run.inputs.mode == PipelineMode::Kontext;
      encode_stage_ = parallel::vae_encode_stage(dir.vae_config(), qc, kontext ? run.inputs.condition.height : run.geometry.height,
                                                 kontext ? run.inputs.condition.width : run.geometry.width,
                                                 request.dtype_bytes, nn::kAttentionChunkBytes);
      request.image_encode_bytes = encode_stage_->total();
    }
  }

  std::string dry_run_text(const PreparedRun& run, const parallel::PlanRequest& request) const override {
    const RunConfig& c = run.config;
    const io::ModelDir& dir = *run.model;
    std::string encode;
    if (encode_stage_)
      encode = str_cat("VAE encoder stage (rank 0, before its blocks load): weights ", format_bytes(encode_stage_->weight_bytes),
                       " + activations ", format_bytes(encode_stage_->activation_bytes), " = ",
                       format_bytes(encode_stage_->total()), "\n");
    return job_text(c, dir, run.geometry, request.images, *run.stages) + describe_inputs(run.inputs, *c.steps) +
           (controlnet_ ? describe_controlnets(*controlnet_, run.inputs) : std::string()) + encode +
           (redux_ ? redux_->describe() : std::string()) +
           dir.describe_sources() + run.pipelines_text + run.stages->table() + lora_table(loras_, *run.stages);
  }

  void check_predictable(const PreparedRun& run) const override {
    if (redux_)
      throw UsageError("--predict: the schedule model covers text-to-image jobs (tools/sim/README.md); this job runs FLUX.1 Redux");
    if (run.inputs.mode != PipelineMode::Text2Img)
      throw UsageError(str_cat("--predict: the schedule model covers text-to-image jobs (tools/sim/README.md); this job is ",
                               mode_name(run.inputs.mode)));
  }

  void complete_plan(const PreparedRun& run, RunPlan& plan) const override {
    const int64_t vae_scale = run.model->vae_config().scale_factor();
    if (run.inputs.condition.height > 0)
      plan.references.push_back({run.inputs.condition.height / vae_scale, run.inputs.condition.width / vae_scale});
    plan.loras = run.config.loras;
    if (redux_) plan.text_tokens += redux_->tokens();  // the images' tokens follow the prompt's
    if (controlnet_) controlnet_plan(*controlnet_, *run.config.guidance, plan);
  }

  // Stage 1: CLIP and T5 (with the LoRAs' text-encoder parts) on each distinct (prompt, prompt_2).
  PromptStage encode_prompts(const PreparedRun& run, at::ScalarType dtype, at::Device device,
                             PromptEmbeddings& out) override {
    if (redux_ && redux_->attributes().zero_text) {
      // FluxPriorReduxPipeline without text encoders: only the Redux stage runs.
      out.text.assign(run.images.size(), PromptEmbedding{});
      PromptStage stage;
      stage.distinct = 0;
      stage.encoders = "Redux encoders (SigLIP, embedder; no prompt: zero text)";
      stage.parameter_bytes = redux_->encode(run, dtype, device, out);
      return stage;
    }
    std::optional<TextEncoders> encoders_slot(std::in_place, *run.model, dtype, device, loras_.files);
    TextEncoders& encoders = *encoders_slot;
    const int64_t msl = *run.config.max_sequence_length;
    PromptStage stage;
    stage.distinct = encode_job_prompts(
        run, run.plan.passes,
        [](const ImageJob& job, int pass) {
          return pass == 0 ? PromptKey{job.prompt, job.prompt_2} : PromptKey{job.negative_prompt, job.negative_prompt};
        },
        [&](const PromptKey& key, size_t i, int pass) {
          return encoders.encode(key.first, key.second, msl,
                                 pass == 0 ? str_cat("image ", i) : str_cat("image ", i, " (negative prompt)"));
        },
        out);
    stage.encoders = "text encoders";
    stage.parameter_bytes = encoders.parameter_bytes();
    if (run.config.keep_encoders) kept_.emplace(std::move(encoders));
    encoders_slot.reset();  // freed before the Redux stage
    if (redux_) {
      stage.encoders += " + Redux encoders (SigLIP, embedder)";
      stage.parameter_bytes += redux_->encode(run, dtype, device, out);
    }
    return stage;
  }

  std::vector<EncodedImage> encode_images(const PreparedRun& run, at::ScalarType dtype, at::Device device) override {
    if (controlnet_) return encode_controlnet_images(run, dtype, device);
    return encode_image_inputs(run, dtype, device);
  }

  void end_stage1() override { loras_ = LoraCheck{}; }  // unmapped: each rank reopens the LoRAs for its slice

  std::string inputs_text(const PreparedRun& run) const override {
    if (run.inputs.mode == PipelineMode::Text2Img) return "";
    std::string d = describe_inputs(run.inputs, *run.config.steps);
    d.pop_back();  // its newline
    if (controlnet_) {
      d += "; " + describe_controlnets(*controlnet_, run.inputs);
      d.pop_back();
    }
    return d;
  }

  void sampling(const PreparedRun& run, const RunPlan&, RootState& state) const override {
    if (run.model->transformer_config().guidance_embeds) state.guidance = *run.config.guidance;
    state.true_cfg_scale = run.config.true_cfg;
  }

  ckpt::TextEmbeddings text_to_checkpoint(const PromptEmbedding& e, const PromptEmbedding* neg) const override {
    ckpt::TextEmbeddings t;
    t.prompt_embeds = e.prompt_embeds;
    t.pooled_prompt_embeds = e.pooled;
    t.clip_input_ids = e.clip_ids;
    t.t5_input_ids = e.t5_ids;
    if (neg != nullptr) {
      t.negative_prompt_embeds = neg->prompt_embeds;
      t.negative_pooled_prompt_embeds = neg->pooled;
    }
    if (redux_) redux_->to_checkpoint(t);
    return t;
  }

  PromptEmbedding text_from_checkpoint(const ckpt::TextEmbeddings& stored, bool negative, at::ScalarType dtype) const override {
    PromptEmbedding e;
    e.prompt_embeds = (negative ? stored.negative_prompt_embeds : stored.prompt_embeds).to(dtype);
    e.pooled = (negative ? stored.negative_pooled_prompt_embeds : stored.pooled_prompt_embeds).to(dtype);
    return e;
  }

  void write_conditioning(ckpt::CheckpointWriter& writer, int64_t image, const PreparedRun& run,
                          const EncodedImage& encoded) const override {
    if (controlnet_) write_controlnet_conditioning(writer, image, encoded);
    else pipeline::write_conditioning(writer, image, run.inputs.mode, encoded);
  }

  Conditioning stored_conditioning(const ckpt::CheckpointReader& reader, int64_t image, const PreparedRun& run,
                                   at::ScalarType dtype) const override {
    if (controlnet_) return stored_controlnet_conditioning(reader, image, run, dtype);
    return pipeline::stored_conditioning(reader, image, run.inputs.mode, dtype);
  }

 private:
  int64_t reference_tokens_ = 0;
  LoraCheck loras_;  // the --lora files, checked against the model
  std::optional<parallel::EncodeStage> encode_stage_;
  std::optional<TextEncoders> kept_;  // --keep-encoders
  std::optional<ReduxJob> redux_;     // --redux-model

  // Whether stage 1 runs the text encoders: images to encode, unless Redux's zero text stands in.
  bool encodes_text(const PreparedRun& run) const {
    return run.any_encoding() && !(redux_ && redux_->attributes().zero_text);
  }
  // The same for what validation and the plan count (a dry run counts the job it describes).
  bool needs_text(const PreparedRun& run) const {
    return (run.config.dry_run || run.any_encoding()) && !(redux_ && redux_->attributes().zero_text);
  }
  std::optional<ControlNetSetup> controlnet_;  // --controlnet
};

}  // namespace

std::unique_ptr<FamilyRoot> flux1_root() { return std::make_unique<Flux1Root>(); }

}  // namespace fluxmpi::pipeline
