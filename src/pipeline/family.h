#pragma once
/// The seam between the run's one flow (src/app: validate, encode, load, denoise, decode, write) and
/// a model family (FLUX.1: pipeline/flux1/, FLUX.2: pipeline/flux2/). Whatever the flow does
/// differently for a family is a call here, so src/app has no family branches; a family is added as
/// a folder under src/pipeline (with its models under src/models) and one line in
/// pipeline/family.cpp (docs/architecture.md, "Model families and modes").
///
/// A family is two objects:
///  - Family: stateless and registered once. What every rank asks of the model, from the run plan
///    alone: the planner's view of the transformer, a rank's transformer part, the text encoder split
///    over ranks, the schedule, the initial noise, the decoders.
///  - FamilyRoot: world rank 0's side of one run, made once the model folder is known and kept until
///    the run ends. The validation steps app/prepare.cpp calls in order, stage 1 (prompts and input
///    images), and how an image's text and conditioning are stored in the checkpoint.
///
/// Conditioning modes (img2img, inpaint, Fill, Control, Kontext, FLUX.2's multi-reference editing
/// today) enter at the edges of the step
/// loop through these calls, never inside the app's flow:
///  - their options and input files: FamilyRoot::resolve / check_job (into PreparedRun::inputs);
///  - their encoders on rank 0: FamilyRoot::encode_images (one EncodedImage per image: a Conditioning,
///    which make_leader_job turns into each work group's GroupInputs), or encode_prompts for what joins
///    the text tokens;
///  - their tensors in the checkpoint, under the image's group: write_conditioning and
///    stored_conditioning (as latents/image is today);
///  - the transformer's inputs and extra tokens: pipeline::GroupInputs and flux::TransformerInputs
///    (pipeline/denoise.h), with the run plan's sizes (RunPlan::text_tokens, references) set by
///    FamilyRoot::complete_plan, and the extra tokens' position ids from the model
///    (flux::StageModel::reference_position_ids);
///  - what runs inside a rank's blocks: Family::load_part builds the rank's flux::StageModel, the
///    one place a family or a mode changes what a slice computes (per-block residuals included).

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/format.h"
#include "io/image_file.h"
#include "io/model_dir.h"
#include "io/png.h"
#include "models/common/loader.h"
#include "models/flux/latents.h"
#include "models/flux/stage_model.h"
#include "models/vae/vae_decoder.h"
#include "parallel/mpi_env.h"
#include "parallel/partition.h"
#include "pipeline/denoise.h"
#include "pipeline/image_conditioning.h"
#include "pipeline/image_job.h"
#include "pipeline/text_stage.h"
#include "pipeline/tile_decode.h"
#include "sched/flow_match_euler.h"

namespace fluxmpi::pipeline {

struct PreparedRun;  // pipeline/prepared_run.h
struct RunPlan;      // pipeline/run_plan.h
class FamilyRoot;

/// What stage 1 made of the job's prompts: per image of the job (undefined for the images that need
/// no encoding).
struct PromptEmbeddings {
  std::vector<PromptEmbedding> text;
  std::vector<PromptEmbedding> negative;  ///< true CFG's second pass
};

/// What the image stage made of one image: its conditioning and, when the run writes a checkpoint,
/// the input pixels it stores (inputs/*).
struct EncodedImage {
  Conditioning conditioning;
  io::Image8 image, mask, control;  ///< as decoded; the mask as stored (grey)
  std::vector<io::Image8> controlnet_images;  ///< ControlNets: each run's control image, as decoded
  std::vector<io::Image8> references;  ///< FLUX.2 multi-reference: each reference image, as decoded
};

/// What FamilyRoot::encode_prompts did, for the log line the flow prints.
struct PromptStage {
  size_t distinct = 0;          ///< prompts encoded (each distinct prompt once)
  std::string encoders;         ///< "text encoders", "text encoder"
  int64_t parameter_bytes = 0;  ///< of the encoders
};

/// A leader's VAE decoder (stage 3).
class ImageDecoder {
 public:
  virtual ~ImageDecoder() = default;
  /// packed latents [n, L, 4C] -> n 8-bit RGB images.
  virtual std::vector<io::RgbImage> decode(const at::Tensor& packed, const flux::LatentGeometry& geometry,
                                           const vae::DecodeOptions& options) const = 0;
};

/// The text encoder split over the leading ranks for stage 1 (RunPlan::text_slices): each of them
/// holds a slice of its layers; the prompts run through the slices.
class SplitTextStage {
 public:
  virtual ~SplitTextStage() = default;
  /// Collective over every rank of `env`. World rank 0 passes its prepared run and gets every fresh
  /// image's embeddings in `out`; the other ranks pass null for both.
  virtual void encode(const parallel::MpiEnv& env, const PreparedRun* run, PromptEmbeddings* out) const = 0;
  /// "text encoder split over ranks: rank 0 layers 0-14, ..." for the log.
  virtual std::string describe() const = 0;
};

/// What every rank asks of a model family.
class Family {
 public:
  virtual ~Family() = default;

  /// "flux1" | "flux2": RunPlan::family and the checkpoint's `family` attribute.
  virtual const char* name() const = 0;
  /// Whether the model folder holds this family (io::ModelDir::family(), from model_index.json).
  virtual bool holds(const io::ModelDir& dir) const = 0;
  /// World rank 0's side of one run.
  virtual std::unique_ptr<FamilyRoot> root() const = 0;
  /// Whether its images have a second prompt (FLUX.1's T5 prompt_2), which their PNGs record.
  virtual bool second_prompt() const = 0;

  /// The planner's view of the transformer (PlanRequest::transformer, and ::family where the
  /// family's counts are not FLUX.1's formulas).
  virtual void plan_transformer(const io::ModelDir& dir, parallel::PlanRequest& request) const = 0;
  /// The transformer part of stage `stage` of `stages`: its blocks, the embedders and the final layer
  /// where the plan puts them, loaded in `dtype` on `device` (with the plan's LoRAs merged).
  virtual std::shared_ptr<flux::StageModel> load_part(const io::ModelDir& dir, const RunPlan& plan,
                                                      const parallel::StagePlan& stages, int stage, at::ScalarType dtype,
                                                      at::Device device, nn::LoadStats* stats) const = 0;
  /// `rank`'s slice of the split text encoder (RunPlan::text_slices not empty), loaded here. Not
  /// collective: the caller agrees on every rank's outcome before encode(). The default refuses: a
  /// family whose plans never split its encoder need not implement it.
  virtual std::unique_ptr<SplitTextStage> split_text_stage(const io::ModelDir& dir, const RunPlan& plan, int rank,
                                                           at::ScalarType dtype, at::Device device) const;
  /// The schedule of `steps` steps for an image of `image_tokens` tokens.
  virtual sched::Schedule schedule(const io::ModelDir& dir, int64_t steps, int64_t image_tokens) const = 0;
  /// [1, L, 4C] packed initial noise of one image (its own CPU generator seeded `seed`), on the CPU.
  virtual at::Tensor initial_latents(int64_t seed, const flux::LatentGeometry& geometry, at::ScalarType dtype) const = 0;
  /// A leader's decoder, loaded here.
  virtual std::unique_ptr<ImageDecoder> decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device) const = 0;
  /// A decode helper's tile decoder (pipeline/tile_decode.h), loaded here.
  virtual TileDecoder tile_decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device) const = 0;
  /// ControlNets (pipeline/control_residuals.h): which block adds which residual sample and at which
  /// steps they flow, the same on every rank of a pipeline. The default: none.
  virtual ControlRouting control_routing(const io::ModelDir& dir, const RunPlan& plan) const;
  /// A pipeline leader's ControlNets, loaded here; null when the run has none (the default).
  virtual std::unique_ptr<ResidualSource> residual_source(const RunPlan& plan, at::ScalarType dtype,
                                                          at::Device device) const;
};

/// The family of the model folder `dir` (ConfigError when no family holds it).
const Family& family_of(const io::ModelDir& dir);
/// The family named `name` in a run plan (CommError for another name).
const Family& family_named(const std::string& name);

/// World rank 0's side of one run of a family. Nothing heavy is read during validation; every
/// mistake is one error (fluxmpi::Error) naming the option, the file or the key.
class FamilyRoot {
 public:
  virtual ~FamilyRoot() = default;
  virtual const Family& family() const = 0;

  // --- Validation: app/prepare.cpp calls these in this order, between its own steps --------------

  /// 1. The options this family refuses, its configs read and checked together, what a resumed
  ///    `checkpoint` (null: none) fills in of its own options, its defaults (steps, guidance, sequence
  ///    length, size), the job's mode and image inputs (run.inputs, the first image's as a preview),
  ///    and run.geometry. run.model and run.config are set; --resume's common options are filled.
  virtual void resolve(PreparedRun& run, const ckpt::CheckpointReader* checkpoint) = 0;
  /// Transformer passes per step: 2 with true CFG (after resolve).
  virtual int passes(const PreparedRun& run) const = 0;
  /// Tokens of an image's transformer call: its image tokens and those that follow them (Kontext's
  /// reference), for the planner.
  virtual int64_t call_image_tokens(const PreparedRun& run) const = 0;
  /// 2. After the job is built (not for --dry-run): the family's prompts of each image, and every
  ///    image's inputs checked (run.inputs.images: one per image).
  virtual void check_job(PreparedRun& run) = 0;
  /// 3. The family's fields of image `image`'s checkpoint attributes (family, mode, inputs, CFG).
  virtual void complete_attributes(const PreparedRun& run, size_t image, ckpt::ImageAttributes& attributes) const = 0;
  /// 4. The checkpoint file's model fields (model_config, vae_scale_factor, sources).
  virtual void file_attributes(const PreparedRun& run, ckpt::FileAttributes& file) const = 0;
  /// 5. The configs against the weight headers of what will run (every component with --dry-run).
  virtual void check_weights(PreparedRun& run) = 0;
  /// 6. The planner's request beyond the transformer and the job: the encoders, the VAE, rank 0's
  ///    encode stage, the text encoder's split (request.world_size and budgets are set).
  virtual void plan(const PreparedRun& run, parallel::PlanRequest& request) = 0;
  /// 7. --dry-run's report once run.stages is planned: the job, the sources, the plan's tables.
  virtual std::string dry_run_text(const PreparedRun& run, const parallel::PlanRequest& request) const = 0;
  /// --predict: UsageError unless the schedule model (tools/sim) covers this job.
  virtual void check_predictable(const PreparedRun& run) const = 0;
  /// 8. The run plan's family fields (guidance, text encoder layers and slices, LoRAs, reference
  ///    size); the flow has filled the common ones and RunPlan::family.
  virtual void complete_plan(const PreparedRun& run, RunPlan& plan) const = 0;

  // --- Stage 1 on rank 0, before the transformer slice is loaded ----------------------------------

  /// Every fresh image's prompt embeddings (each distinct prompt encoded once; the encoders freed
  /// unless the family keeps them for --keep-encoders). Not called when the plan splits the text
  /// encoder over ranks (Family::split_text_stage).
  virtual PromptStage encode_prompts(const PreparedRun& run, at::ScalarType dtype, at::Device device,
                                     PromptEmbeddings& out) = 0;
  /// The input images' conditioning, one per image of the job (empty for the images not encoded),
  /// when run.inputs.encodes(); the encoders are freed before it returns. The default has no inputs.
  virtual std::vector<EncodedImage> encode_images(const PreparedRun& run, at::ScalarType dtype, at::Device device);
  /// After stage 1: drops what validation kept open for it (FLUX.1: the LoRA files' mappings).
  virtual void end_stage1() {}
  /// One log line describing the job's inputs ("mode: img2img (...)"); empty for text-to-image.
  virtual std::string inputs_text(const PreparedRun& run) const;

  // --- The leader job (app/leader_job.cpp) and the checkpoint --------------------------------------

  /// The step loop's guidance and true-CFG scale.
  virtual void sampling(const PreparedRun& run, const RunPlan& plan, RootState& state) const = 0;
  /// An image's embeddings as the checkpoint stores them (text/*), `negative` with true CFG.
  virtual ckpt::TextEmbeddings text_to_checkpoint(const PromptEmbedding& text, const PromptEmbedding* negative) const = 0;
  /// A resumed image's embeddings (the negative ones with `negative`) in `dtype`: the transformer's
  /// inputs (prompt_embeds, pooled).
  virtual PromptEmbedding text_from_checkpoint(const ckpt::TextEmbeddings& stored, bool negative,
                                               at::ScalarType dtype) const = 0;
  /// Writes an image's inputs (inputs/*) and conditioning tensors (latents/image, ...) under its
  /// group; not flushed. The default stores nothing.
  virtual void write_conditioning(ckpt::CheckpointWriter& writer, int64_t image, const PreparedRun& run,
                                  const EncodedImage& encoded) const;
  /// A resumed image's conditioning as write_conditioning stored it, in `dtype`. The default: none.
  virtual Conditioning stored_conditioning(const ckpt::CheckpointReader& reader, int64_t image, const PreparedRun& run,
                                           at::ScalarType dtype) const;
};

/// Stage 1's loop over the job, for FamilyRoot::encode_prompts: for every image still to encode and
/// each of the run's passes (true CFG's negative second), the embedding of `key(job, pass)`, each
/// distinct key encoded once by `encode(key, image, pass)`, in the order of the job. Returns how many
/// distinct keys were encoded.
using PromptKey = std::pair<std::string, std::string>;
size_t encode_job_prompts(const PreparedRun& run, int passes,
                          const std::function<PromptKey(const ImageJob& job, int pass)>& key,
                          const std::function<PromptEmbedding(const PromptKey& key, size_t image, int pass)>& encode,
                          PromptEmbeddings& out);

}  // namespace fluxmpi::pipeline
