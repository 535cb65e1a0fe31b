// Every way a file given to --resume or fluxmpi-inspect can be wrong gives one CheckpointError
// naming the file and the object. Damaged checkpoints are made from a good one with h5py (the
// project's HDF5 C calls stay in src/ckpt).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "core/error.h"
#include "unit/ckpt_test_job.h"

namespace fluxmpi::ckpt {
namespace {
using namespace test;

// "CheckpointError: <message>" of opening `path`, "opened" if it opens.
std::string open_error(const std::string& path) {
  try {
    CheckpointReader::open(path);
  } catch (const Error& e) {
    return str_cat(e.kind(), ": ", e.what());
  }
  return "opened";
}

// The error of resume() on the same file: the writer validates exactly as the reader does.
std::string resume_error(const std::string& path) {
  Job job = tiny_job();
  try {
    CheckpointWriter::resume(path, job.file, job.images);
  } catch (const Error& e) {
    return str_cat(e.kind(), ": ", e.what());
  }
  return "resumed";
}

class CheckpointValidation : public testing::Test {
 protected:
  std::string good() {
    std::string path = dir_.path(str_cat("c", counter_++, ".h5"));
    make_finished(path);
    return path;
  }
  // A finished checkpoint changed by a Python snippet that sees it as `f` (h5py.File, mode r+).
  std::string damaged(const std::string& python) {
    std::string path = good();
    std::string script = "import sys, h5py, numpy as np\nf = h5py.File(sys.argv[1], 'r+')\n" + python + "\nf.close()\n";
    std::string out;
    int rc = run_command("/usr/bin/python3 -c " + shell_quote(script) + " " + shell_quote(path), &out);
    EXPECT_EQ(rc, 0) << out;
    return path;
  }
  TempDir dir_;
  int counter_ = 0;
};

TEST_F(CheckpointValidation, AGoodCheckpointOpens) {
  std::string path = good();
  EXPECT_EQ(open_error(path), "opened");
  EXPECT_EQ(resume_error(path), "resumed");
}

TEST_F(CheckpointValidation, MissingFileOrDirectory) {
  EXPECT_EQ(open_error(dir_.path("absent.h5")), str_cat("CheckpointError: ", dir_.path("absent.h5"), ": no such file"));
  std::filesystem::create_directory(dir_.path("d.h5"));
  EXPECT_EQ(open_error(dir_.path("d.h5")),
            str_cat("CheckpointError: ", dir_.path("d.h5"), ": is a directory, expected an HDF5 file"));
}

TEST_F(CheckpointValidation, NotHdf5) {
  const std::string text = dir_.path("notes.h5");
  std::ofstream(text) << "this is a text file, not HDF5\n";
  const std::string expected = str_cat("CheckpointError: ", text, ": not an HDF5 file (no HDF5 signature)");
  EXPECT_EQ(open_error(text), expected);
  EXPECT_EQ(resume_error(text), expected);
  const std::string empty = dir_.path("empty.h5");
  std::ofstream{empty};
  EXPECT_EQ(open_error(empty), str_cat("CheckpointError: ", empty, ": not an HDF5 file (no HDF5 signature)"));
}

TEST_F(CheckpointValidation, TruncatedFile) {
  std::string path = good();
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  // HDF5 1.10 refuses the open itself, 1.14 opens the file (and would then wait on the missing
  // metadata): both end in the same line.
  const std::string expected = str_cat("CheckpointError: ", path, ": truncated HDF5 file, shorter than its superblock says (",
                                       size / 2, " bytes, the superblock records ", size, ")");
  EXPECT_EQ(open_error(path), expected);
  EXPECT_EQ(resume_error(path), expected);
}

TEST_F(CheckpointValidation, PlainHdf5FileIsNotACheckpoint) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged("del f.attrs['format']");
  EXPECT_EQ(open_error(path),
            str_cat("CheckpointError: ", path, ": not a fluxmpi checkpoint (the root group has no 'format' attribute)"));
}

TEST_F(CheckpointValidation, WrongFormatAttribute) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged("f.attrs['format'] = 'nexus'");
  const std::string expected =
      str_cat("CheckpointError: ", path, ": not a fluxmpi checkpoint (attribute 'format' is 'nexus', expected 'fluxmpi')");
  EXPECT_EQ(open_error(path), expected);
  EXPECT_EQ(resume_error(path), expected);
}

TEST_F(CheckpointValidation, WrongFormatVersion) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged("f.attrs['format_version'] = np.int64(2)");
  EXPECT_EQ(open_error(path),
            str_cat("CheckpointError: ", path, ": format_version 2 is not supported (this fluxmpi reads version 1)"));
}

TEST_F(CheckpointValidation, MissingDataset) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged("del f['images/00001/latents/noise_pred']");
  const std::string expected =
      str_cat("CheckpointError: ", path, ": /images/00001/latents/noise_pred: missing (expected float32 [n, 8, 64])");
  EXPECT_EQ(open_error(path), expected);
  EXPECT_EQ(resume_error(path), expected);
  std::string no_group = damaged("del f['images/00000/text']");
  EXPECT_EQ(open_error(no_group),
            str_cat("CheckpointError: ", no_group, ": /images/00000/text/prompt_embeds: missing (expected float32 [16, 32])"));
}

TEST_F(CheckpointValidation, WrongShapeAndDtype) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged(
      "g = f['images/00000/latents']\ndel g['steps']\n"
      "g.create_dataset('steps', data=np.zeros((2, 8), np.int32), maxshape=(None, 8))");
  EXPECT_EQ(open_error(path),
            str_cat("CheckpointError: ", path, ": /images/00000/latents/steps: expected float32 [n, 8, 64], got int32 [2, 8]"));
}

TEST_F(CheckpointValidation, WrongDtype) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged(
      "g = f['images/00001/text']\nids = g['clip_input_ids'][()]\ndel g['clip_input_ids']\n"
      "g['clip_input_ids'] = ids.astype(np.int64)");
  EXPECT_EQ(open_error(path),
            str_cat("CheckpointError: ", path, ": /images/00001/text/clip_input_ids: expected int32 [77], got int64 [77]"));
  std::string f64 = damaged(
      "g = f['images/00000/schedule']\ns = g['sigmas'][()]\ndel g['sigmas']\ng['sigmas'] = s.astype(np.float64)");
  EXPECT_EQ(open_error(f64),
            str_cat("CheckpointError: ", f64, ": /images/00000/schedule/sigmas: expected float32 [5], got float64 [5]"));
}

TEST_F(CheckpointValidation, WrongShape) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged(
      "g = f['images/00000/text']\ndel g['prompt_embeds']\ng['prompt_embeds'] = np.zeros((16, 33), np.float32)");
  EXPECT_EQ(open_error(path), str_cat("CheckpointError: ", path,
                                      ": /images/00000/text/prompt_embeds: expected float32 [16, 32], got float32 [16, 33]"));
  std::string scalar = damaged("del f['images/00000/last_step']\nf['images/00000/last_step'] = np.array([3], np.int64)");
  EXPECT_EQ(open_error(scalar),
            str_cat("CheckpointError: ", scalar, ": /images/00000/last_step: expected int64 scalar, got int64 [1]"));
}

TEST_F(CheckpointValidation, NotExtendable) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged(
      "g = f['images/00000/latents']\nx = g['noise_pred'][()]\ndel g['noise_pred']\ng['noise_pred'] = x");
  EXPECT_EQ(open_error(path), str_cat("CheckpointError: ", path,
                                      ": /images/00000/latents/noise_pred: not extendable (maximum shape [4, 8, 64]); "
                                      "rows could not be appended"));
}

TEST_F(CheckpointValidation, MissingOrMistypedAttribute) {
  FLUXMPI_REQUIRE_H5PY();
  std::string missing = damaged("del f['images/00001'].attrs['seed']");
  EXPECT_EQ(open_error(missing), str_cat("CheckpointError: ", missing, ": /images/00001: attribute 'seed' is missing"));
  std::string mistyped = damaged("f['images/00000'].attrs['height'] = '64'");
  EXPECT_EQ(open_error(mistyped), str_cat("CheckpointError: ", mistyped,
                                          ": /images/00000: attribute 'height': expected an integer, got string"));
  std::string size = damaged("f['images/00000'].attrs['height'] = np.int64(40)");
  EXPECT_EQ(open_error(size), str_cat("CheckpointError: ", size,
                                      ": /images/00000: attribute 'height' must be a positive multiple of 16 "
                                      "(2 * vae_scale_factor), got 40"));
  std::string config = damaged("f.attrs['model_config'] = 'not json'");
  EXPECT_EQ(open_error(config).rfind(str_cat("CheckpointError: ", config, ": attribute 'model_config': not valid JSON"), 0),
            0u)
      << open_error(config);
}

TEST_F(CheckpointValidation, ImageGroupsMustBeNumberedWithoutGaps) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = damaged("f.move('images/00001', 'images/00002')");
  EXPECT_EQ(open_error(path), str_cat("CheckpointError: ", path,
                                      ": /images: found '00002' where '00001' was expected (image groups are numbered "
                                      "00000, 00001, ... without gaps)"));
}

TEST_F(CheckpointValidation, InconsistentRowsAndStatus) {
  FLUXMPI_REQUIRE_H5PY();
  std::string range = damaged("f['images/00000/last_step'][()] = 9");
  EXPECT_EQ(open_error(range), str_cat("CheckpointError: ", range,
                                       ": /images/00000/last_step: is 9, outside -1..3 (num_inference_steps 4)"));
  std::string index = damaged("f['images/00001/latents/step_index'][2] = 7");
  EXPECT_EQ(open_error(index), str_cat("CheckpointError: ", index,
                                       ": /images/00001/last_step: is 3 but latents/step_index has no row for that step "
                                       "(stored: [0, 1, 7, 3])"));
  std::string status = damaged("f['images/00000/status'][()] = b'done'");
  EXPECT_EQ(open_error(status), str_cat("CheckpointError: ", status,
                                        ": /images/00000/status: status is 'done', expected encoding, denoising or decoded"));
  std::string cfg = damaged("f['images/00000/text/negative_prompt_embeds'] = np.zeros((16, 32), np.float32)");
  EXPECT_EQ(open_error(cfg), str_cat("CheckpointError: ", cfg,
                                     ": /images/00000/text/negative_prompt_embeds: present although true CFG is off "
                                     "(true_cfg_scale 1, negative_prompt '')"));
}

// A process killed while it had the file open for writing without SWMR (here h5py in r+ mode)
// leaves the superblock marked "open for writing" but not "SWMR writing", which SWMR readers and
// plain HDF5 readers both refuse; the reader and resume() still open it.
TEST_F(CheckpointValidation, OpensAFileWhoseNonSwmrWriterWasKilled) {
  FLUXMPI_REQUIRE_H5PY();
  std::string path = good();
  std::string script = "import sys, os, signal, h5py\nf = h5py.File(sys.argv[1], 'r+')\nf.flush()\n"
                       "os.kill(os.getpid(), signal.SIGKILL)\n";
  std::string out;
  EXPECT_NE(run_command("/usr/bin/python3 -c " + shell_quote(script) + " " + shell_quote(path), &out), 0) << out;
  if (std::filesystem::exists("/usr/bin/h5dump"))
    EXPECT_NE(run_command("/usr/bin/h5dump -H " + shell_quote(path), &out), 0) << "expected a file marked open:\n" << out;
  EXPECT_EQ(open_error(path), "opened");
  EXPECT_EQ(resume_error(path), "resumed");
}

// Nothing of HDF5's own error stack reaches stderr.
TEST_F(CheckpointValidation, PrintsNothingOnStderr) {
  const std::string text = dir_.path("junk.h5");
  std::ofstream(text) << "junk";
  testing::internal::CaptureStderr();
  open_error(text);
  open_error(dir_.path("absent.h5"));
  std::string path = good();
  std::filesystem::resize_file(path, 3000);
  open_error(path);
  resume_error(path);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace fluxmpi::ckpt
