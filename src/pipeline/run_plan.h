#pragma once
/// What rank 0 decides before any heavy work and every rank needs: sent once from rank 0 to all
/// ranks as JSON, so the other ranks never parse the command line themselves.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/lora_file.h"
#include "io/model_dir.h"
#include "models/flux/latents.h"
#include "parallel/partition.h"
#include "io/controlnet_config.h"
#include "pipeline/control_residuals.h"
#include "pipeline/denoise.h"

namespace fluxmpi::pipeline {

struct RunPlan {
  std::string model;
  io::ModelSources sources;  ///< as rank 0 resolved them (config folder included): no rank re-decides
  std::string dtype;
  std::string device;
  int64_t threads = 0;
  int log_level = 2;
  int64_t steps = 0;
  int64_t text_tokens = 0;
  int64_t latent_height = 0, latent_width = 0;
  /// Reference images (Kontext's one, FLUX.2's multi-reference): each one's latent size, in order.
  std::vector<LatentSize> references;
  int passes = 1;
  std::string family = "flux1";  ///< "flux1" | "flux2": which model family's stages the ranks run
  /// FLUX.2 only: the guidance embedder's scale (dev; absent for klein), the text encoder's layers.
  std::optional<double> guidance;
  std::vector<int64_t> text_encoder_layers;
  /// FLUX.2 with its text encoder split over ranks (parallel/text_split.h): the layers
  /// [first, last + 1) each leading rank loads for the encoding stage; empty: rank 0 encodes alone.
  std::vector<parallel::BlockRange> text_slices;
  int64_t patches = 1;
  int64_t warmup_steps = 1;
  std::vector<pipeline::WorkGroup> groups;
  /// `--stages`: ranks per pipeline S (P/S pipelines); `ranges` are the S slices every pipeline runs.
  int stages = 1;
  int world_size = 1;
  std::vector<parallel::BlockRange> ranges;  ///< blocks of each stage (rank of a pipeline)
  /// What a pipeline leader needs to decode its images and to send their rows to rank 0.
  flux::LatentGeometry geometry;
  bool vae_tiling = false;
  bool vae_slicing = false;
  int64_t microbatch = 1;
  bool checkpoint = false;        ///< world rank 0 writes a checkpoint file
  int64_t checkpoint_every = 1;
  /// The ranks of a pipeline that decode VAE tiles (parallel::StagePlan::decode_ranks; ranks of the
  /// pipeline's communicator), its leader first; one rank (or none): the leader decodes alone.
  std::vector<int> decode_ranks;
  std::vector<io::LoraSpec> loras;           ///< merged by every rank into the modules it owns
  /// ControlNets (docs/controlnet.md): the folders each pipeline leader loads, the runs (a net on
  /// one control image), the merged samples' layout every rank routes by, the ControlNets' guidance.
  std::vector<std::string> controlnets;
  std::vector<ControlRun> control_runs;
  io::ResidualLayout control_layout;
  double controlnet_guidance = 0;
};

std::string to_json(const RunPlan& plan);
RunPlan run_plan_from_json(const std::string& text);

}  // namespace fluxmpi::pipeline
