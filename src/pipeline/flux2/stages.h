#pragma once
/// The FLUX.2 family's stages (pipeline/flux2/family.cpp): the text stage (the
/// tokenizer's chat template and the decoder-only encoder, built up to the last layer used), the
/// transformer part a rank holds, the initial noise, the schedule and the decode. The step loop,
/// the messages, the planner and the checkpoint are the ones FLUX.1 uses.

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "io/model_dir.h"
#include "io/png.h"
#include "models/common/loader.h"
#include "models/flux/latents.h"
#include "models/flux/stage_model.h"
#include "models/vae/vae_decoder.h"
#include "parallel/message.h"
#include "parallel/mpi_env.h"
#include "parallel/partition.h"
#include "pipeline/family.h"
#include "pipeline/text_stage.h"
#include "sched/flow_match_euler.h"

namespace fluxmpi::pipeline {

/// Rank 0's text stage: Flux2Tokenizer + TextDecoder of the layers `layers` needs.
class Flux2TextStage {
 public:
  Flux2TextStage(const io::ModelDir& dir, const std::vector<int64_t>& layers, at::ScalarType dtype, at::Device device);
  ~Flux2TextStage();
  Flux2TextStage(Flux2TextStage&&) noexcept;

  /// One prompt -> prompt_embeds [S, layers x H] (run dtype), input_ids and attention_mask [S]
  /// (int64). `what` names the prompt in the truncation warning.
  pipeline::PromptEmbedding encode(const std::string& prompt, int64_t max_length, const std::string& what) const;
  int64_t parameter_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The split text stage (RunPlan::text_slices non-empty): every rank loads its slice of the
/// encoder's layers, rank 0 tokenizes, the prompts run through the slices (pipeline/text_split.h).
class Flux2SplitTextStage {
 public:
  /// Builds the plan of `slices` (as rank 0 planned them) and loads `rank`'s layers (none beyond
  /// the slices). Not collective: the caller agrees on every rank's outcome before encode().
  Flux2SplitTextStage(const io::ModelDir& dir, const std::vector<parallel::BlockRange>& slices,
                      const std::vector<int64_t>& layers, int rank, at::ScalarType dtype, at::Device device);
  ~Flux2SplitTextStage();
  /// Collective over every rank of `env`. `prompts` (rank 0's; ignored elsewhere) -> on rank 0 one
  /// PromptEmbedding per prompt as Flux2TextStage::encode makes it; empty elsewhere.
  std::vector<pipeline::PromptEmbedding> encode(const parallel::MpiEnv& env, parallel::Messenger* messenger,
                                                const std::vector<std::string>& prompts, int64_t max_length) const;
  /// "text encoder: layers 0-14 on rank 0, ..." for the log.
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The blocks [first, end) of the FLUX.2 transformer (with the embedders and global modulation on
/// the first rank, the final layer on the last), loaded from the folder's transformer/.
std::shared_ptr<flux::StageModel> load_flux2_stage(const io::ModelDir& dir, int64_t first, int64_t end, bool embedders,
                                                   bool final_layer, at::ScalarType dtype, at::Device device,
                                                   nn::LoadStats* stats);

/// [1, L, 4C] packed initial noise of one image (its own CPU generator seeded `seed`), on the CPU.
at::Tensor flux2_initial_latents(int64_t seed, const flux::LatentGeometry& geometry, at::ScalarType dtype);

/// The schedule: sigmas linspace(1, 1/N, N) shifted by compute_empirical_mu(L, N).
sched::Schedule flux2_run_schedule(const io::ModelDir& dir, int64_t steps, int64_t image_tokens);

/// A leader's decoder: AutoencoderKLFlux2's decode path.
class Flux2Decoder : public ImageDecoder {
 public:
  Flux2Decoder(const io::ModelDir& dir, at::ScalarType dtype, at::Device device);
  ~Flux2Decoder() override;
  /// packed latents [n, L, 4C] -> n 8-bit RGB images.
  std::vector<io::RgbImage> decode(const at::Tensor& packed, const flux::LatentGeometry& geometry,
                                   const vae::DecodeOptions& options) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxmpi::pipeline
