#pragma once
/// Writing fluxmpi HDF5 checkpoints (rank 0 only; the other ranks never touch HDF5).
///
/// SWMR discipline (HDF5 1.10 supports nothing else under SWMR, see docs/hdf5-format.md):
/// create() makes every group, dataset and attribute of the whole job at once, in the latest file
/// format, then starts SWMR writing; afterwards the writer only writes into existing datasets and
/// appends rows to the three extendable ones. A concurrent reader (fluxmpi-inspect --follow, h5py
/// with swmr=True) sees a consistent file at every moment.
///
/// Durability: append_step() and set_status() flush. A row becomes part of the checkpoint
/// ("committed") when last_step names it, and last_step is written only after the row is flushed,
/// so a writer killed at any moment leaves a file whose committed rows are complete; resume()
/// discards the unfinished rest. write_text(), write_schedule(), write_initial() and write_image()
/// do not flush: the set_status() that follows them does (Denoising after the first three,
/// Decoded after the image), and it flushes before it writes the status, so a status is never on
/// disk before the data it announces.
///
/// Typical use by the pipeline:
///   auto ckpt = CheckpointWriter::create(path, file_attrs, image_attrs);   // status "encoding"
///   ckpt.write_text(i, text); ckpt.write_schedule(i, timesteps, sigmas); ckpt.write_initial(i, x);
///   ckpt.set_status(i, ImageStatus::Denoising);
///   for each kept step k: ckpt.append_step(i, k, x_next, v);
///   ckpt.write_image(i, rgb); ckpt.set_status(i, ImageStatus::Decoded);
///
/// Input tensors may have any floating dtype (ids: any integer dtype) on any device; they are
/// stored as float32 (int32). A leading batch dimension of 1 is accepted and dropped. A shape that
/// does not match the layout, or a step out of order, is an InternalError (a bug of the caller);
/// HDF5 failures while writing are IoError.

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/format.h"
#include "io/png.h"

namespace fluxmpi::ckpt {

class CheckpointWriter {
 public:
  /// Creates `path` with the layout of the whole job. Refuses an existing file with UsageError
  /// "--checkpoint 'x.h5' already exists; continue it with --resume x.h5 or remove it". Empty
  /// `fluxmpi_version` / `created` are filled in. A failure while creating removes the partial file.
  static CheckpointWriter create(const std::string& path, const FileAttributes& file,
                                 const std::vector<ImageAttributes>& images);

  /// Opens an existing checkpoint to continue writing it. Handles a file left by a killed writer
  /// (it clears the stale "open for writing" mark, as `h5clear -s` does), validates the layout,
  /// refuses with CheckpointError a file made for another job (check_matches against the request)
  /// or one that a live writer holds, and removes rows that a killed writer left unfinished.
  static CheckpointWriter resume(const std::string& path, const FileAttributes& requested_file,
                                 const std::vector<ImageAttributes>& requested_images);

  CheckpointWriter(CheckpointWriter&&) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&&) noexcept;
  /// Closes the file if close() was not called; errors are logged, not thrown.
  ~CheckpointWriter();

  /// Reads through the writer's own handle: per-image state, stored text, latest latents.
  const CheckpointReader& contents() const;
  int64_t num_images() const;
  const std::string& path() const;

  /// Stage 1 output of an image (see TextEmbeddings for shapes; the negative_* tensors exactly
  /// when uses_true_cfg(attributes)).
  void write_text(int64_t image, const TextEmbeddings& text);
  /// timesteps [steps], sigmas [steps + 1].
  void write_schedule(int64_t image, const at::Tensor& timesteps, const at::Tensor& sigmas);
  /// The packed initial noise [L_img, token_dim].
  void write_initial(int64_t image, const at::Tensor& latents);
  /// Image-conditioned modes: a float dataset (latents/image, latents/noise, latents/mask) or an
  /// input's pixels (inputs/image, inputs/control_image [h, w, 3], inputs/mask [h, w] uint8); a
  /// leading batch dimension of 1 is dropped. Not flushed (the set_status that follows flushes).
  void write_condition(int64_t image, const std::string& name, const at::Tensor& values);
  /// Appends the row of step `step` (latents after the step, x_{step+1}, and the transformer's
  /// v_step, both [L_img, token_dim]), then commits it through last_step. `step` must exceed the
  /// last committed step and be below num_inference_steps.
  void append_step(int64_t image, int64_t step, const at::Tensor& latents, const at::Tensor& noise_pred);
  /// Patch-pipelined images (patches > 1): records in `latents/exact` whether `step` ran exact;
  /// written before the step's row, so the row's flush covers it. Nothing for other images.
  void write_step_mode(int64_t image, int64_t step, bool exact);
  void set_status(int64_t image, ImageStatus status);
  /// The decoded picture; its size must be the image's height x width.
  void write_image(int64_t image, const io::RgbImage& pixels);
  void flush();
  /// Flushes and closes; IoError if HDF5 reports a failure. Further calls are InternalError.
  void close();

 private:
  struct Impl;
  explicit CheckpointWriter(std::unique_ptr<Impl> impl);
  Impl& impl() const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxmpi::ckpt
