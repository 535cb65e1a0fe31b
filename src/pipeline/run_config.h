#pragma once
/// The validated options of one `fluxmpi` run (DESIGN.md §7), filled by app::parse_options() from
/// the command line and an optional INI file. A plain value: no Boost types, nothing lazily read.
/// It lives below the app so that the model families (pipeline/family.h) read it too.
///
/// The caller resolves it in this order, all before any heavy work:
///   1. parse_options()                      (app/options.h: syntax, ranges, files and paths)
///   2. with --resume: fill what was omitted from the checkpoint (prompts, seed, sizes, ...);
///      what was given (see `given`) must match the checkpoint, which the checkpoint layer checks
///   3. resolve_seed()                       (app/job.h: draws a seed when none was given)
///   4. the model family's defaults          (e.g. pipeline/flux1/defaults.h: size flooring)
///   5. build_job()                          (app/job.h: one ImageJob per image)

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/log.h"
#include "io/lora_file.h"

namespace fluxmpi::pipeline {

/// Image size when --height/--width are omitted.
inline constexpr int64_t kDefaultImageSize = 1024;

/// The image inputs of one line of a JSON Lines prompts file (docs/cli.md, "JSON Lines"): absolute
/// paths, empty where the line names none (the command line's then apply).
struct PromptInputs {
  /// "image": one path, or (FLUX.2 reference images) a list; `image` is the first.
  std::vector<std::string> images;
  std::string image, mask, control_image;
  std::optional<double> strength;
  int64_t line = 0;  ///< 1-based line of the prompts file
};

struct RunConfig {
  // Model.
  std::string model;   ///< --model: diffusers FluxPipeline folder or a .safetensors file; empty only with --resume or a --transformer
  std::string dtype;   ///< "auto" | "fp32" | "bf16" | "fp16"; "auto" (the default) is resolved by prepare_run (app/defaults.h)
  std::string device = "cpu";  ///< "cpu" | "cuda"
  /// --lora FILE[:SCALE], repeatable, in the order given (merged in that order); absolute paths.
  std::vector<io::LoraSpec> loras;
  // Single files (docs/cli.md, "Using the files you already have"): each replaces that component
  // of --model, which may itself be a .safetensors file; --model-config gives configs/tokenizers.
  std::string transformer, vae, text_encoder, text_encoder_2;
  std::string model_config;

  // Sampling.
  /// From --prompt (one) or --prompts-file (one per non-blank line). Empty only with --resume
  /// (the checkpoint holds them) or --dry-run (no images are made).
  std::vector<std::string> prompts;
  std::string prompts_file;  ///< the --prompts-file the prompts came from; empty for --prompt
  /// JSON Lines prompts files: one entry per prompt (same order); empty for plain prompts.
  std::vector<PromptInputs> prompt_inputs;
  std::string prompt_2;      ///< T5 prompt of every image; empty = the prompt itself (diffusers: `prompt_2 or prompt`)
  /// --negative-prompt; absent and "" differ, as in diffusers: true CFG needs a negative prompt.
  std::optional<std::string> negative_prompt;
  double true_cfg = 1.0;     ///< --true-cfg >= 1; true CFG runs when > 1 and a negative prompt is given
  int64_t num_images = 1;    ///< images per prompt
  std::optional<int64_t> seed;                 ///< S: image i gets S + i; resolve_seed() fills it
  std::optional<int64_t> height;               ///< pixels; resolve_defaults() fills and floors them
  std::optional<int64_t> width;
  std::optional<int64_t> steps;                ///< num_inference_steps
  std::optional<double> guidance;              ///< guidance_scale (dev); 0 after resolving for schnell
  std::optional<int64_t> max_sequence_length;  ///< T5 tokens, 1..512 (FLUX.2: the text encoder's)
  /// FLUX.2: --text-encoder-layers (diffusers' text_encoder_out_layers); empty: the model's default.
  std::vector<int64_t> text_encoder_layers;

  // Image inputs (docs/images.md): absolute paths, empty when not given. --image is repeatable: a
  // FLUX.2 model's reference images (docs/flux2.md); `image` is the first of `images`.
  std::vector<std::string> images;
  std::string image, mask, control_image;
  std::optional<double> strength;  ///< --strength in (0, 1]; resolved per mode (0.6 img2img/inpaint, 1 Fill)
  std::string pipeline;            ///< --pipeline NAME, empty when not given
  std::optional<int64_t> max_area; ///< Kontext: --max-area (default 1024 x 1024)
  bool no_auto_resize = false;     ///< Kontext: --no-auto-resize
  // ControlNets (docs/controlnet.md): --controlnet folders and, with them, every --control-image
  // (absolute paths; without --controlnet the one --control-image is `control_image`, a Control
  // model's); --control-mode, --controlnet-scale, --control-guidance-start/-end as given (one value
  // for every control image, or one per image).
  std::vector<std::string> controlnets, controlnet_images;
  std::vector<int64_t> control_modes;
  std::vector<double> controlnet_scales, control_guidance_starts, control_guidance_ends;

  // FLUX.1 Redux (docs/redux.md): absolute paths, empty when not given.
  std::string redux_model;                ///< --redux-model: a FluxPriorReduxPipeline folder
  std::vector<std::string> redux_images;  ///< --redux-image, repeatable, in order
  /// --redux-prompt-scale / --redux-pooled-scale: one value for every image or one per image;
  /// empty: 1 (diffusers' prompt_embeds_scale, pooled_prompt_embeds_scale).
  std::vector<double> redux_prompt_scales, redux_pooled_scales;
  /// Redux without --prompt: the prior's zero text (no text encoder runs); the job's prompt is "".
  bool redux_zero_text = false;

  // Output.
  std::string output;         ///< -o pattern; empty = fluxmpi.png / fluxmpi-{i}.png (see image_output_path)
  std::string checkpoint;     ///< --checkpoint: a new HDF5 file to create; empty = none
  int64_t checkpoint_every = 1;
  std::string resume;         ///< --resume: an existing checkpoint to continue (and write on into)
  bool no_progress = false;

  // Parallel.
  int64_t threads = 0;        ///< per rank; 0 = max(1, cores of the node / ranks on the node)
  std::string balance = "compute";  ///< "compute" | "memory"
  std::string partition;      ///< --partition, e.g. "0:0-8,1:9-56" (parsed by the partition planner)
  std::string max_memory;     ///< --max-memory, e.g. "0=16GiB,1=24GiB" (parsed by the partition planner)
  int64_t stages = 0;         ///< --stages S: ranks per pipeline; 0 = all ranks (one pipeline)
  int64_t microbatch = 1;
  bool keep_encoders = false;
  bool vae_tiling = false;    ///< --vae-tiling (the plan may also switch it on for a --max-memory budget)
  bool vae_slicing = false;   ///< --vae-slicing
  // Patch pipelining (pipeline/denoise.h): one image faster on more ranks, approximately.
  int64_t patches = 1;        ///< --patches M: patches per pipelined step; 1 = every step exact
  int64_t warmup_steps = 1;   ///< --warmup-steps W >= 1: exact steps before the pipelined ones

  // General.
  bool dry_run = false;
  std::string predict;  ///< --predict PROFILE.json (with --dry-run): the schedule model's prediction
  log::Level log_level = log::Level::Info;
  std::string config_file;    ///< the --config INI file read; empty = none

  /// Long names of the options set explicitly, on the command line or in the INI file
  /// ("steps", "num-images", ...): a resumed run compares exactly these with the checkpoint.
  std::set<std::string> given;

  bool was_given(const std::string& option) const { return given.count(option) != 0; }
  /// diffusers' do_true_cfg: true_cfg_scale > 1 and a negative prompt (possibly "") is given.
  bool true_cfg_enabled() const { return true_cfg > 1.0 && negative_prompt.has_value(); }
  /// The HDF5 file this run writes: the --resume file (written on into), else --checkpoint, else "".
  const std::string& checkpoint_file() const { return resume.empty() ? checkpoint : resume; }
};

}  // namespace fluxmpi::pipeline
