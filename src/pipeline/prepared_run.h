#pragma once
/// What rank 0's validation (app::prepare_run) makes of a run before any heavy work: the options as
/// resolved, the model, the job, the checkpoint's attributes, where each image stands, the stage
/// plan and the run plan every rank gets.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/format.h"
#include "io/model_dir.h"
#include "models/flux/latents.h"
#include "parallel/partition.h"
#include "pipeline/family.h"
#include "pipeline/image_job.h"
#include "pipeline/job_inputs.h"
#include "pipeline/run_config.h"
#include "pipeline/run_plan.h"

namespace fluxmpi::pipeline {

/// Where one image of the job stands.
struct ImageProgress {
  bool decoded = false;         ///< nothing left to do
  bool needs_encoding = true;   ///< text embeddings must be computed (not in the checkpoint)
  int64_t start_step = 0;       ///< first step to run; == steps: only decoding is left
};

struct PreparedRun {
  RunConfig config;
  std::optional<io::ModelDir> model;
  /// The model's family and its rank-0 side of this run (pipeline/family.h), set with `model`.
  const Family* family = nullptr;
  std::shared_ptr<FamilyRoot> family_root;
  std::vector<ImageJob> images;
  std::vector<ckpt::ImageAttributes> attributes;
  ckpt::FileAttributes file;
  flux::LatentGeometry geometry;
  std::vector<ImageProgress> progress;
  bool resumed = false;
  RunPlan plan;
  std::optional<parallel::StagePlan> stages;
  JobInputs inputs;  ///< the mode and the decoded input images (every image of the job)
  /// --dry-run with --stages: the pipelines, their ranks and hosts (printed above the plan).
  std::string pipelines_text;
  /// The job's ranks P; `stages` and `plan` are one pipeline's S ranks (--stages; S = P without).
  int world_size = 1;

  bool any_encoding() const;
};

/// --patches against the image: a patch is at least one row of image tokens (UsageError otherwise).
/// Each family calls it once it knows the geometry.
void check_patch_rows(const RunConfig& config, const flux::LatentGeometry& geometry);

}  // namespace fluxmpi::pipeline
