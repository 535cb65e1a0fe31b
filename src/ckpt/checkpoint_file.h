#pragma once
// Internal to src/ckpt: an open checkpoint file with its validated attributes and shapes, shared by
// CheckpointReader (SWMR read) and CheckpointWriter (SWMR write, which reads back what resume needs
// through the same handle: HDF5 refuses a second open of one file with other flags in a process).

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/format.h"
#include "ckpt/h5.h"

namespace fluxmpi::ckpt::detail {

class CheckpointFile {
 public:
  // Opens `path` for reading: SWMR read, or, for a file whose writer died before SWMR started,
  // a plain read that ignores the stale "open for writing" mark. Throws CheckpointError.
  static h5::Handle open_for_reading(const std::string& path);
  // One line for a failed H5Fopen of `path`, from the innermost HDF5 message (not HDF5 at all,
  // truncated, locked, or else the HDF5 message itself).
  static std::string open_failure(const std::string& path, const std::string& detail);
  /// Throws CheckpointError when the file is shorter than the end of allocation its superblock
  /// records (a truncated copy or download), unless a live writer holds the file: its end of
  /// allocation may run ahead of the data it is still writing.
  static void check_not_truncated(const std::string& path, hid_t file, bool writer_may_be_live);

  // Takes an open file and validates it (attributes, every dataset, committed rows).
  // `swmr_reader`: refresh dataset metadata before each read, as a SWMR reader must.
  CheckpointFile(std::string path, h5::Handle file, bool swmr_reader);

  const std::string& path() const { return path_; }
  hid_t id() const { return file_.get(); }
  const FileAttributes& file() const { return attrs_; }
  const io::TransformerConfig& config() const { return config_; }
  int64_t num_images() const { return static_cast<int64_t>(images_.size()); }
  const std::vector<ImageAttributes>& images() const { return images_; }
  const ImageAttributes& image(int64_t i) const;
  const ImageShape& shape(int64_t i) const;
  const std::vector<DatasetSpec>& specs(int64_t i) const;
  const DatasetSpec& spec(int64_t i, const std::string& name) const;

  // "<path>: /images/00003/latents/steps"
  std::string where(int64_t i, const std::string& name) const;

  // Opens a dataset of image i (refreshed for SWMR readers).
  h5::Handle open_dataset(int64_t i, const std::string& name, h5::Fault fault) const;
  // The whole dataset in its stored type (a String dataset is refused).
  at::Tensor read(int64_t i, const std::string& name) const;
  // Rows [first, first + count) of an extendable dataset.
  at::Tensor read_rows(int64_t i, const std::string& name, int64_t first, int64_t count) const;
  std::string read_status_text(int64_t i) const;
  ImageState state(int64_t i) const;
  // The stored step_index values of the committed rows.
  std::vector<int64_t> committed_steps(int64_t i) const;

  // Closes the file; false if HDF5 reported an error (the final flush failed).
  bool close() { return file_.close(); }

 private:
  void validate_root();
  void validate_image(int64_t i);
  void validate_dataset(int64_t i, const DatasetSpec& spec);
  // Row bookkeeping shared by state() and committed_steps().
  struct Rows {
    int64_t last_step = -1;
    std::vector<int64_t> steps;  // committed
  };
  Rows rows(int64_t i) const;

  std::string path_;
  h5::Handle file_;
  bool swmr_reader_ = false;
  FileAttributes attrs_;
  io::TransformerConfig config_;
  std::vector<ImageAttributes> images_;
  std::vector<ImageShape> shapes_;
  std::vector<std::vector<DatasetSpec>> specs_;
};

}  // namespace fluxmpi::ckpt::detail
