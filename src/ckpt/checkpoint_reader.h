#pragma once
/// Reading and validating fluxmpi HDF5 checkpoints (`--resume`, fluxmpi-inspect, tests).
///
/// open() checks the whole layout before anything is used: format == "fluxmpi", format_version ==
/// 1, every attribute, and every dataset's presence, type and shape as implied by the attributes.
/// Each failure is one CheckpointError naming the file and the object, e.g.
///   run.h5: /images/00003/latents/steps: expected float32 [n, 1024, 64], got int32 [2, 1024]
/// Files that are not HDF5, truncated files and files HDF5 cannot open give a CheckpointError too;
/// HDF5's own error printing is switched off.
///
/// The file is opened for SWMR reading, so a checkpoint that a running job is writing can be read;
/// a file whose writer was killed (superblock still marked "open for writing") is read as well,
/// without modifying it. Everything that changes while a job runs (status, last_step, rows) is read
/// from the file on every call.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/format.h"
#include "io/png.h"

namespace fluxmpi::ckpt {

namespace detail {
class CheckpointFile;
}

/// What stage 1 produced for one image. Float tensors are float32, ids int64 (as the tokenizers
/// and embedding layers use them); the negative_* tensors are undefined unless true CFG.
struct TextEmbeddings {
  at::Tensor prompt_embeds;                  ///< [S, joint_attention_dim] (Redux: S = max_sequence_length + its tokens)
  at::Tensor pooled_prompt_embeds;           ///< [pooled_projection_dim]
  at::Tensor clip_input_ids;                 ///< [77] (undefined for Redux without a prompt)
  at::Tensor t5_input_ids;                   ///< [max_sequence_length] (idem)
  at::Tensor negative_prompt_embeds;         ///< [S, joint_attention_dim] or undefined
  at::Tensor negative_pooled_prompt_embeds;  ///< [pooled_projection_dim] or undefined
  // FLUX.2 (family flux2) instead of the CLIP/T5/pooled tensors above:
  at::Tensor input_ids;                      ///< [S] the text encoder's ids
  at::Tensor attention_mask;                 ///< [S] 1 = real token
  at::Tensor negative_input_ids;             ///< [S] or undefined
  at::Tensor negative_attention_mask;        ///< [S] or undefined
  // FLUX.1 Redux (attribute `redux`): what the prior made the text from.
  at::Tensor redux_image_embeds;             ///< [N, L, joint_attention_dim]: each image's tokens, unscaled
  std::vector<at::Tensor> redux_images;      ///< written only: N [h, w, 3] uint8, the images as decoded
};

/// The changing part of an image group.
struct ImageState {
  ImageStatus status = ImageStatus::Encoding;
  int64_t last_step = -1;  ///< step of the last committed row; -1 before step 0
  /// Committed rows of latents/steps, noise_pred and step_index: those up to last_step. Rows past
  /// it are an append that a killed writer did not finish; they are ignored (and removed by resume).
  int64_t rows = 0;
};

/// One committed row: the latents after step `step` (x_{step+1}) and the noise prediction v_step.
struct StepRow {
  int64_t step = 0;
  at::Tensor latents;     ///< [L_img, token_dim] float32
  at::Tensor noise_pred;  ///< [L_img, token_dim] float32
};

class CheckpointReader {
 public:
  /// Opens and validates `path`. Throws CheckpointError.
  static CheckpointReader open(const std::string& path);

  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;
  ~CheckpointReader();

  const std::string& path() const;
  const FileAttributes& file() const;
  /// The transformer config stored in the `model_config` attribute.
  const io::TransformerConfig& transformer_config() const;
  int64_t num_images() const;
  const std::vector<ImageAttributes>& attributes() const;
  const ImageAttributes& attributes(int64_t image) const;
  const ImageShape& shape(int64_t image) const;

  /// Status, last_step and committed rows, read now.
  ImageState state(int64_t image) const;
  TextEmbeddings text(int64_t image) const;
  at::Tensor timesteps(int64_t image) const;  ///< [steps] float32
  at::Tensor sigmas(int64_t image) const;     ///< [steps + 1] float32
  at::Tensor initial_latents(int64_t image) const;  ///< [L_img, token_dim] float32
  /// The step of each committed row, in row order.
  std::vector<int64_t> step_indices(int64_t image) const;
  /// Committed row `row` (0 <= row < state().rows); CheckpointError otherwise.
  StepRow row(int64_t image, int64_t row) const;
  /// The row holding step `step`; CheckpointError naming the stored steps when there is none.
  StepRow step(int64_t image, int64_t step) const;
  /// Where a resumed run continues: the latents of the last committed row (x_{last_step+1}), or
  /// the initial latents when no row is committed.
  at::Tensor latest_latents(int64_t image) const;
  /// The `image` dataset ([H, W, 3] uint8; zeros until the image is decoded).
  io::RgbImage image(int64_t image) const;

  /// Any dataset of an image by its relative name (see dataset_specs), in its stored type as a
  /// tensor (float32, int32, int64, uint8; `status` is not numeric and is refused). The extendable
  /// datasets are cut to the committed rows.
  at::Tensor dataset(int64_t image, const std::string& name) const;

 private:
  friend class CheckpointWriter;
  explicit CheckpointReader(std::shared_ptr<detail::CheckpointFile> file);
  std::shared_ptr<detail::CheckpointFile> file_;
};

}  // namespace fluxmpi::ckpt
