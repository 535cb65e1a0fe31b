#pragma once
/// FLUX.1 Redux in a FLUX.1 run (docs/redux.md): what Flux1Root does for --redux-model at each of
/// its steps. Validation reads the Redux folder's configs and decodes the reference images (once:
/// every image of the job shares them); stage 1 runs rank 0's Redux stage (pipeline/redux_stage.h)
/// after the text encoders and turns each prompt's embeddings (or the prior's zeros) into the longer
/// text stream; the checkpoint stores the attribute `redux`, the images and their tokens.

#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/format.h"
#include "io/image_file.h"
#include "io/model_dir.h"
#include "io/redux_dir.h"
#include "parallel/encode_memory.h"
#include "parallel/partition.h"
#include "pipeline/family.h"
#include "pipeline/prepared_run.h"

namespace fluxmpi::pipeline {

class ReduxJob {
 public:
  /// The run's Redux, or none. Fills what --resume leaves out from the checkpoint's first image;
  /// refuses true CFG (UsageError), opens and checks the folder (ConfigError), decodes every image
  /// (UsageError / ImageError naming --redux-image), and sets the Redux default of
  /// --max-sequence-length (512, the prior's). Call before the model's defaults are resolved.
  static std::optional<ReduxJob> resolve(RunConfig& config, const ckpt::CheckpointReader* checkpoint);

  /// Tokens the images add to the text stream (the encoder's patches).
  int64_t tokens() const { return dir_.image_tokens(); }
  const ckpt::ImageAttributes::Redux& attributes() const { return attributes_; }
  /// The embedder against the transformer, both weight files from their headers.
  void check_weights(const io::ModelDir& model) const;
  /// The text grows by tokens(); rank 0's Redux stage when the run encodes (`encodes`).
  void plan(parallel::PlanRequest& request, bool encodes);
  /// The stage's line in --dry-run.
  std::string describe() const;
  /// --resume: every stored reference image decodes to the same pixels (CheckpointError otherwise).
  void check_unchanged(const ckpt::CheckpointReader& checkpoint) const;

  /// Stage 1 after the text encoders: encodes the images (SigLIP and the embedder loaded and freed
  /// here), then gives every fresh image of `out` the prior's text (its prompt's, or zeros). Returns
  /// the parameter bytes of the encoders.
  int64_t encode(const PreparedRun& run, at::ScalarType dtype, at::Device device, PromptEmbeddings& out);
  /// The Redux datasets of an image's text (encode() must have run).
  void to_checkpoint(ckpt::TextEmbeddings& text) const;

 private:
  ReduxJob(io::ReduxDir dir) : dir_(std::move(dir)) {}
  io::ReduxDir dir_;
  ckpt::ImageAttributes::Redux attributes_;
  std::vector<io::Image8> images_;
  std::optional<parallel::EncodeStage> stage_;
  at::Tensor embeds_;  ///< [N, L, D] after encode()
};

}  // namespace fluxmpi::pipeline
