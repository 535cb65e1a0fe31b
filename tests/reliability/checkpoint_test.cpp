// Bad-input table, part 4: checkpoints given to `fluxmpi --resume` and to `fluxmpi-inspect`:
// files that are not HDF5, truncated files, HDF5 files of another format or format version, a
// dataset missing, and a checkpoint of another job. Each row starts from a checkpoint written by
// fluxmpi itself and must leave it untouched.

#include <hdf5.h>

#include <stdexcept>

#include "core/error.h"
#include "harness.h"

namespace fluxmpi::reliability {
namespace {
using Setup = std::function<void(Workspace&)>;

// The checkpoint of the table's default options, copied into the workspace as run.h5.
std::string copy_checkpoint(Workspace& w) {
  const std::string path = w.path("run.h5");
  write_bytes(path, read_bytes(valid_checkpoint()));
  return path;
}

void must(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("HDF5: " + what + " failed");
}

// Edits the file with the HDF5 C library, as another program (or a newer fluxmpi) would.
void with_hdf5_file(const std::string& path, const std::function<void(hid_t)>& edit) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  must(f >= 0, "opening " + path);
  edit(f);
  must(H5Fclose(f) >= 0, "closing " + path);
}

void set_int64_attribute(hid_t f, const char* name, int64_t value) {
  const hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  must(a >= 0, std::string("opening attribute ") + name);
  must(H5Awrite(a, H5T_NATIVE_INT64, &value) >= 0, std::string("writing attribute ") + name);
  H5Aclose(a);
}

void set_string_attribute(hid_t f, const char* name, const char* value) {
  must(H5Adelete(f, name) >= 0, std::string("deleting attribute ") + name);
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  must(a >= 0, std::string("creating attribute ") + name);
  must(H5Awrite(a, type, &value) >= 0, std::string("writing attribute ") + name);
  H5Aclose(a);
  H5Sclose(space);
  H5Tclose(type);
}

Setup not_hdf5() {
  return [](Workspace& w) { write_bytes(w.path("run.h5"), "fluxmpi checkpoint? no: plain text\n"); };
}
Setup truncated() {
  return [](Workspace& w) {
    const std::string path = copy_checkpoint(w);
    truncate_file(path, read_bytes(path).size() / 2);
  };
}
Setup other_version() {
  return [](Workspace& w) {
    with_hdf5_file(copy_checkpoint(w), [](hid_t f) { set_int64_attribute(f, "format_version", 2); });
  };
}
Setup other_format() {
  return [](Workspace& w) {
    with_hdf5_file(copy_checkpoint(w), [](hid_t f) { set_string_attribute(f, "format", "zarr-like"); });
  };
}
Setup dataset_missing() {
  return [](Workspace& w) {
    with_hdf5_file(copy_checkpoint(w), [](hid_t f) {
      must(H5Ldelete(f, "/images/00000/latents/initial", H5P_DEFAULT) >= 0, "deleting latents/initial");
    });
  };
}

std::vector<BadInput> rows() {
  const std::vector<std::string> resume = {"--resume", "{work}/run.h5"};
  return {
      // --- fluxmpi --resume -------------------------------------------------------------------------
      BadInput("resume_not_hdf5", kExitBadInput, "CheckpointError", {"{work}/run.h5: not an HDF5 file (no HDF5 signature)"})
          .setup(not_hdf5())
          .args(resume),
      BadInput("resume_truncated", kExitBadInput, "CheckpointError", {"{work}/run.h5: truncated HDF5 file"})
          .setup(truncated())
          .args(resume),
      BadInput("resume_other_format", kExitBadInput, "CheckpointError",
               {"{work}/run.h5: not a fluxmpi checkpoint (attribute 'format' is 'zarr-like', expected 'fluxmpi')"})
          .setup(other_format())
          .args(resume),
      BadInput("resume_other_format_version", kExitBadInput, "CheckpointError",
               {"{work}/run.h5: format_version 2 is not supported (this fluxmpi reads version 1)"})
          .setup(other_version())
          .args(resume),
      BadInput("resume_dataset_missing", kExitBadInput, "CheckpointError", {"{work}/run.h5: /images/00000/latents/initial: missing"})
          .setup(dataset_missing())
          .args(resume),
      BadInput("resume_other_job", kExitBadInput, "CheckpointError",
               {"{work}/run.h5: /images/00000: 'prompt' is \"a photo of a cat\" in the checkpoint", "the checkpoint belongs to another job"})
          .setup([](Workspace& w) { copy_checkpoint(w); })
          .args({"--resume", "{work}/run.h5", "--prompt", "a photo of a dog"}),

      // --- fluxmpi-inspect --------------------------------------------------------------------------
      BadInput("inspect_missing_file", kExitBadInput, "CheckpointError", {"{work}/run.h5: no such file"})
          .inspect()
          .args({"{work}/run.h5"}),
      BadInput("inspect_not_hdf5", kExitBadInput, "CheckpointError", {"{work}/run.h5: not an HDF5 file (no HDF5 signature)"})
          .setup(not_hdf5())
          .inspect()
          .args({"{work}/run.h5"}),
      BadInput("inspect_truncated", kExitBadInput, "CheckpointError", {"{work}/run.h5: truncated HDF5 file"})
          .setup(truncated())
          .inspect()
          .args({"{work}/run.h5"}),
      BadInput("inspect_other_format_version", kExitBadInput, "CheckpointError",
               {"{work}/run.h5: format_version 2 is not supported (this fluxmpi reads version 1)"})
          .setup(other_version())
          .inspect()
          .args({"{work}/run.h5", "--stats"}),
  };
}

class Checkpoints : public testing::TestWithParam<BadInput> {};

TEST_P(Checkpoints, FailsCleanly) { GetParam().check(); }

INSTANTIATE_TEST_SUITE_P(BadInputs, Checkpoints, testing::ValuesIn(rows()), row_name);

}  // namespace
}  // namespace fluxmpi::reliability
