// The HDF5 checkpoint store: writer/reader round trip, the DESIGN.md §5 layout as HDF5's own tools
// show it, a concurrent SWMR reader (h5py), a writer killed with SIGKILL and resumed, and the
// refusals of create() and resume().

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#include "ckpt/checkpoint_file.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "core/error.h"
#include "core/version.h"
#include "support/tensor_compare.h"
#include "unit/ckpt_test_job.h"

namespace fluxmpi::ckpt {
namespace {
using namespace test;
using fluxmpi::test::identical;

// The first thing a forked child does: the parent has run libtorch's OpenMP kernels by then, and
// GNU libgomp's thread pool does not survive fork(), so a child entering a parallel region waits
// forever for workers it lacks (Debian 13, libtorch 2.6: the killed writer of 512 x 256 rows hung
// before its first step in every round after the first). One thread: no parallel region.
void enter_forked_child() { at::set_num_threads(1); }

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return str_cat(e.kind(), ": ", e.what());
  }
  return "no error";
}

TEST(CheckpointStore, RoundTripsEveryDatasetAndAttribute) {
  TempDir dir;
  const std::string path = dir.path("run.h5");
  Job job = tiny_job();
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    write_job(w);
    w.close();
  }
  CheckpointReader r = CheckpointReader::open(path);
  EXPECT_EQ(r.file().format_version, 1);
  EXPECT_EQ(r.file().model, job.file.model);
  EXPECT_EQ(r.file().model_config, job.file.model_config);
  EXPECT_EQ(r.file().fluxmpi_version, std::string(kVersion));
  EXPECT_TRUE(std::regex_match(r.file().created, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"))) << r.file().created;
  EXPECT_EQ(r.transformer_config().joint_attention_dim, 32);
  ASSERT_EQ(r.num_images(), 2);
  for (int64_t i = 0; i < 2; ++i) {
    const ImageAttributes& a = r.attributes(i);
    const ImageAttributes& e = job.images[i];
    EXPECT_EQ(a.prompt, e.prompt);
    EXPECT_EQ(a.prompt_2, e.prompt_2);
    EXPECT_EQ(a.negative_prompt, e.negative_prompt);
    EXPECT_EQ(a.seed, e.seed);
    EXPECT_EQ(a.height, e.height);
    EXPECT_EQ(a.width, e.width);
    EXPECT_EQ(a.num_inference_steps, e.num_inference_steps);
    EXPECT_EQ(a.guidance_scale, e.guidance_scale);
    EXPECT_EQ(a.true_cfg_scale, e.true_cfg_scale);
    EXPECT_EQ(a.max_sequence_length, e.max_sequence_length);
    EXPECT_EQ(a.dtype, e.dtype);

    const ImageShape& s = r.shape(i);
    EXPECT_EQ(s.image_tokens, 8);
    EXPECT_EQ(s.token_dim, 64);
    EXPECT_EQ(s.true_cfg, i == 1);
    ImageState st = r.state(i);
    EXPECT_EQ(st.status, ImageStatus::Decoded);
    EXPECT_EQ(st.last_step, 3);
    EXPECT_EQ(st.rows, 4);

    TextEmbeddings want = text_of(s, i);
    TextEmbeddings got = r.text(i);
    EXPECT_TRUE(identical("prompt_embeds", got.prompt_embeds, want.prompt_embeds));
    EXPECT_TRUE(identical("pooled_prompt_embeds", got.pooled_prompt_embeds, want.pooled_prompt_embeds));
    EXPECT_TRUE(identical("clip_input_ids", got.clip_input_ids, want.clip_input_ids));
    EXPECT_TRUE(identical("t5_input_ids", got.t5_input_ids, want.t5_input_ids));
    EXPECT_EQ(got.negative_prompt_embeds.defined(), i == 1);
    if (i == 1) {
      EXPECT_TRUE(identical("negative_prompt_embeds", got.negative_prompt_embeds, want.negative_prompt_embeds));
      EXPECT_TRUE(identical("negative_pooled", got.negative_pooled_prompt_embeds, want.negative_pooled_prompt_embeds));
    }
    at::Tensor sigmas = sigmas_of(s);
    EXPECT_TRUE(identical("sigmas", r.sigmas(i), sigmas));
    EXPECT_TRUE(identical("timesteps", r.timesteps(i), sigmas.slice(0, 0, 4) * 1000));
    EXPECT_TRUE(identical("initial", r.initial_latents(i), step_latents(s, i, -1)));
    EXPECT_EQ(r.step_indices(i), (std::vector<int64_t>{0, 1, 2, 3}));
    for (int64_t k = 0; k < 4; ++k) {
      StepRow row = r.row(i, k);
      EXPECT_EQ(row.step, k);
      EXPECT_TRUE(identical(str_cat("steps[", k, "]"), row.latents, step_latents(s, i, k)));
      EXPECT_TRUE(identical(str_cat("noise_pred[", k, "]"), row.noise_pred, step_noise(s, i, k)));
    }
    EXPECT_TRUE(identical("latest_latents", r.latest_latents(i), step_latents(s, i, 3)));
    EXPECT_EQ(r.image(i).pixels, picture_of(s, i).pixels);
    EXPECT_EQ(r.dataset(i, "latents/steps").sizes(), at::IntArrayRef({4, 8, 64}));
  }
}

TEST(CheckpointStore, KeepsOnlyTheRowsOfCheckpointEveryAndNamesMissingSteps) {
  TempDir dir;
  const std::string path = dir.path("every.h5");
  Job job = tiny_job(5);
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    write_job(w, /*every=*/2);  // steps 1, 3 and the last, 4
  }  // the destructor closes
  CheckpointReader r = CheckpointReader::open(path);
  EXPECT_EQ(r.step_indices(0), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(r.state(0).last_step, 4);
  EXPECT_TRUE(identical("step 3", r.step(0, 3).latents, step_latents(r.shape(0), 0, 3)));
  EXPECT_EQ(error_of([&] { r.step(0, 2); }),
            str_cat("CheckpointError: ", path, ": /images/00000/latents/steps: step 2 is not stored (stored steps: [1, 3, 4])"));
}

TEST(CheckpointStore, CreateRefusesAnExistingFile) {
  TempDir dir;
  const std::string path = dir.path("x.h5");
  std::ofstream(path) << "anything";
  Job job = tiny_job();
  EXPECT_EQ(error_of([&] { CheckpointWriter::create(path, job.file, job.images); }),
            str_cat("UsageError: --checkpoint '", path, "' already exists; continue it with --resume ", path,
                    " or remove it"));
  std::ifstream in(path);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "anything") << "create() must not touch an existing file";
}

TEST(CheckpointStore, WriterRefusesOutOfOrderStepsAndWrongShapes) {
  TempDir dir;
  Job job = tiny_job();
  CheckpointWriter w = CheckpointWriter::create(dir.path("o.h5"), job.file, job.images);
  const ImageShape& s = w.contents().shape(0);
  w.append_step(0, 1, step_latents(s, 0, 1), step_noise(s, 0, 1));
  EXPECT_EQ(error_of([&] { w.append_step(0, 1, step_latents(s, 0, 1), step_noise(s, 0, 1)); }),
            "InternalError: checkpoint: /images/00000: append_step(1) after step 1 of 4");
  EXPECT_EQ(error_of([&] { w.append_step(0, 4, step_latents(s, 0, 1), step_noise(s, 0, 1)); }),
            "InternalError: checkpoint: /images/00000: append_step(4) after step 1 of 4");
  EXPECT_EQ(error_of([&] { w.write_initial(0, at::zeros({8, 16})); }),
            "InternalError: checkpoint: /images/00000/latents/initial: expected shape [8, 64], got [8, 16]");
  // A batch dimension of 1 and other float dtypes are accepted.
  w.write_initial(1, step_latents(s, 1, -1).unsqueeze(0).to(at::kBFloat16));
  EXPECT_TRUE(identical("initial from bf16", w.contents().initial_latents(1),
                        step_latents(s, 1, -1).to(at::kBFloat16).to(at::kFloat)));
}

// h5ls -r and h5dump -H are the view of users without fluxmpi: the names, shapes and types of
// DESIGN.md §5 must appear there exactly. The expectations are written out here, not derived from
// the code under test.
TEST(CheckpointStore, H5lsAndH5dumpShowTheDesignLayout) {
  for (const char* tool : {"/usr/bin/h5ls", "/usr/bin/h5dump"})
    if (!std::filesystem::exists(tool)) GTEST_SKIP() << tool << " not found (Debian: hdf5-tools)";
  TempDir dir;
  const std::string path = dir.path("layout.h5");
  make_finished(path);

  std::string ls;
  ASSERT_EQ(run_command("/usr/bin/h5ls -r " + shell_quote(path), &ls), 0) << ls;
  std::map<std::string, std::string> listed;
  std::istringstream lines(ls);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, m, std::regex(R"((\S+)\s+(.*))"))) listed[m[1]] = m[2];
  }
  const std::vector<std::pair<std::string, std::string>> expected_ls = {
      {"/images", "Group"},
      {"/images/00000", "Group"},
      {"/images/00000/status", "Dataset {SCALAR}"},
      {"/images/00000/last_step", "Dataset {SCALAR}"},
      {"/images/00000/text/prompt_embeds", "Dataset {16, 32}"},
      {"/images/00000/text/pooled_prompt_embeds", "Dataset {24}"},
      {"/images/00000/text/clip_input_ids", "Dataset {77}"},
      {"/images/00000/text/t5_input_ids", "Dataset {16}"},
      {"/images/00000/schedule/timesteps", "Dataset {4}"},
      {"/images/00000/schedule/sigmas", "Dataset {5}"},
      {"/images/00000/latents/initial", "Dataset {8, 64}"},
      {"/images/00000/latents/steps", "Dataset {4/Inf, 8, 64}"},
      {"/images/00000/latents/noise_pred", "Dataset {4/Inf, 8, 64}"},
      {"/images/00000/latents/step_index", "Dataset {4/Inf}"},
      {"/images/00000/image", "Dataset {64, 32, 3}"},
      {"/images/00001/text/negative_prompt_embeds", "Dataset {16, 32}"},
      {"/images/00001/text/negative_pooled_prompt_embeds", "Dataset {24}"},
  };
  for (const auto& [name, what] : expected_ls) EXPECT_EQ(listed[name], what) << name << " in h5ls -r:\n" << ls;
  EXPECT_EQ(listed.count("/images/00000/text/negative_prompt_embeds"), 0u) << "no true CFG for image 0";

  auto header = [&](const std::string& flag, const std::string& object) {
    std::string out;
    EXPECT_EQ(run_command("/usr/bin/h5dump -H " + flag + " " + object + " " + shell_quote(path), &out), 0) << out;
    return std::regex_replace(out, std::regex(R"(\s+)"), " ");
  };
  const std::string f32 = "DATATYPE H5T_IEEE_F32LE", i32 = "DATATYPE H5T_STD_I32LE", i64 = "DATATYPE H5T_STD_I64LE";
  const std::string f64 = "DATATYPE H5T_IEEE_F64LE";
  const std::string vlen_utf8 = "STRSIZE H5T_VARIABLE; STRPAD H5T_STR_NULLTERM; CSET H5T_CSET_UTF8;";
  const std::vector<std::tuple<std::string, std::string, std::string>> datasets = {
      {"/images/00001/text/prompt_embeds", f32, "SIMPLE { ( 16, 32 ) / ( 16, 32 ) }"},
      {"/images/00001/text/negative_pooled_prompt_embeds", f32, "SIMPLE { ( 24 ) / ( 24 ) }"},
      {"/images/00001/text/clip_input_ids", i32, "SIMPLE { ( 77 ) / ( 77 ) }"},
      {"/images/00001/text/t5_input_ids", i32, "SIMPLE { ( 16 ) / ( 16 ) }"},
      {"/images/00001/schedule/sigmas", f32, "SIMPLE { ( 5 ) / ( 5 ) }"},
      {"/images/00001/latents/initial", f32, "SIMPLE { ( 8, 64 ) / ( 8, 64 ) }"},
      {"/images/00001/latents/steps", f32, "SIMPLE { ( 4, 8, 64 ) / ( H5S_UNLIMITED, 8, 64 ) }"},
      {"/images/00001/latents/noise_pred", f32, "SIMPLE { ( 4, 8, 64 ) / ( H5S_UNLIMITED, 8, 64 ) }"},
      {"/images/00001/latents/step_index", i32, "SIMPLE { ( 4 ) / ( H5S_UNLIMITED ) }"},
      {"/images/00001/image", "DATATYPE H5T_STD_U8LE", "SIMPLE { ( 64, 32, 3 ) / ( 64, 32, 3 ) }"},
      {"/images/00001/last_step", i64, "DATASPACE SCALAR"},
      {"/images/00001/status", "STRSIZE 16; STRPAD H5T_STR_NULLPAD; CSET H5T_CSET_UTF8;", "DATASPACE SCALAR"},
  };
  for (const auto& [name, type, space] : datasets) {
    std::string h = header("-d", name);
    EXPECT_NE(h.find(type), std::string::npos) << name << ": no '" << type << "' in " << h;
    EXPECT_NE(h.find(space), std::string::npos) << name << ": no '" << space << "' in " << h;
  }
  const std::vector<std::pair<std::string, std::string>> attributes = {
      {"/format", vlen_utf8},        {"/format_version", i64},   {"/fluxmpi_version", vlen_utf8},
      {"/model", vlen_utf8},         {"/model_config", vlen_utf8}, {"/created", vlen_utf8},
      {"/vae_scale_factor", i64},    {"/images/00001/prompt", vlen_utf8},
      {"/images/00001/prompt_2", vlen_utf8}, {"/images/00001/negative_prompt", vlen_utf8},
      {"/images/00001/seed", i64},   {"/images/00001/height", i64}, {"/images/00001/width", i64},
      {"/images/00001/num_inference_steps", i64}, {"/images/00001/guidance_scale", f64},
      {"/images/00001/true_cfg_scale", f64}, {"/images/00001/max_sequence_length", i64},
      {"/images/00001/dtype", vlen_utf8},
  };
  for (const auto& [name, type] : attributes) {
    std::string h = header("-a", name);
    EXPECT_NE(h.find(type), std::string::npos) << name << ": no '" << type << "' in " << h;
    EXPECT_NE(h.find("DATASPACE SCALAR"), std::string::npos) << name << ": " << h;
  }
  std::string all = header("-A", "");  // attributes with values
  EXPECT_NE(all.find(R"(ATTRIBUTE "format" { DATATYPE H5T_STRING)"), std::string::npos);
  std::string data;
  ASSERT_EQ(run_command("/usr/bin/h5dump -a /format " + shell_quote(path), &data), 0);
  EXPECT_NE(data.find("\"fluxmpi\""), std::string::npos) << data;
}

// A SWMR reader in another process (h5py, swmr=True) reads the file while this process still has
// it open for writing, sees the rows appended since, and computes x0 as docs/hdf5-format.md shows.
TEST(CheckpointStore, SwmrReaderInAnotherProcessFollowsTheWriter) {
  FLUXMPI_REQUIRE_H5PY();
  TempDir dir;
  const std::string path = dir.path("live.h5");
  Job job = tiny_job();
  CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
  const ImageShape& s = w.contents().shape(0);
  write_prologue(w, 0);
  const std::string script = R"(
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r", swmr=True) as f:
    g = f["images/00000"]
    status = g["status"][()]
    status = status.decode() if isinstance(status, bytes) else status
    last = int(g["last_step"][()])
    idx = g["latents/step_index"][()].tolist()
    rows = g["latents/steps"].shape[0]
    x0 = float("nan")
    if last >= 0:
        r = idx.index(last)
        sigma = g["schedule/sigmas"][last + 1]
        x0 = g["latents/steps"][r] - sigma * g["latents/noise_pred"][r]
        x0 = float(np.abs(x0).sum())
    print(status, last, rows, ",".join(map(str, idx)) or "-", repr(x0))
)";
  auto observe = [&] {
    std::string out;
    int rc = run_command("/usr/bin/python3 -c " + shell_quote(script) + " " + shell_quote(path), &out);
    EXPECT_EQ(rc, 0) << out;
    return out;
  };
  auto x0_sum = [&](int64_t k) {
    double sigma = sigmas_of(s)[k + 1].item<float>();
    return (step_latents(s, 0, k) - sigma * step_noise(s, 0, k)).abs().sum().item<float>();
  };
  auto parse = [](const std::string& out, std::string* status, int64_t* last, int64_t* rows, std::string* idx,
                  double* x0) {
    std::istringstream in(out);
    in >> *status >> *last >> *rows >> *idx >> *x0;
  };
  std::string status, idx;
  int64_t last = 0, rows = 0;
  double x0 = 0;
  parse(observe(), &status, &last, &rows, &idx, &x0);
  EXPECT_EQ(status, "denoising");
  EXPECT_EQ(last, -1);
  EXPECT_EQ(rows, 0);

  w.append_step(0, 0, step_latents(s, 0, 0), step_noise(s, 0, 0));
  w.append_step(0, 1, step_latents(s, 0, 1), step_noise(s, 0, 1));
  parse(observe(), &status, &last, &rows, &idx, &x0);
  EXPECT_EQ(last, 1);
  EXPECT_EQ(rows, 2);
  EXPECT_EQ(idx, "0,1");
  EXPECT_NEAR(x0, x0_sum(1), 1e-3 * std::abs(x0_sum(1)));

  w.append_step(0, 3, step_latents(s, 0, 3), step_noise(s, 0, 3));
  w.write_image(0, picture_of(s, 0));
  w.set_status(0, ImageStatus::Decoded);
  parse(observe(), &status, &last, &rows, &idx, &x0);
  EXPECT_EQ(status, "decoded");
  EXPECT_EQ(last, 3);
  EXPECT_EQ(idx, "0,1,3");
  EXPECT_NEAR(x0, x0_sum(3), 1e-3 * std::abs(x0_sum(3)));
  w.close();
}

// What one poll of the checkpoint's path found.
enum class Seen { NotFound, NotYetReadable, Consistent, Broken };

// One open of `path` as a reader does it: SWMR read (`swmr`) or a plain read-only H5Fopen, then
// the whole layout validated and every image's state read. `generation` gets the number the
// writer put in the file's 'model' attribute; `detail` what went wrong.
Seen poll_once(const std::string& path, bool swmr, int64_t* generation, std::string* detail) {
  hid_t id = H5Fopen(path.c_str(), swmr ? H5F_ACC_RDONLY | H5F_ACC_SWMR_READ : H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) {
    *detail = h5::take_error();
    // The file is not there, or this test removed it (between generations) while HDF5 was
    // opening it: HDF5 looks the name up again (lstat) after open().
    if (detail->find("No such file or directory") != std::string::npos ||
        detail->find("can't retrieve stat info for file") != std::string::npos)
      return Seen::NotFound;
    // A plain reader refuses a file a SWMR writer holds: not readable yet, by design. Which check
    // trips first depends on the moment: the "open for writing" mark, the end of file the
    // superblock records, which runs ahead of the bytes on disk while the writer works, or the
    // superblock's checksum when the plain read (which does not retry as a SWMR read does) meets
    // the writer rewriting it.
    if (!swmr && (detail->find("file is already open for write") != std::string::npos ||
                  detail->find("truncated file") != std::string::npos ||
                  detail->find("incorrect metadata checksum") != std::string::npos))
      return Seen::NotYetReadable;
    return Seen::Broken;
  }
  try {
    detail::CheckpointFile f(path, h5::Handle(id, H5Fclose), swmr);
    const std::string& model = f.file().model;
    const std::string prefix = "/models/generation-";
    if (model.rfind(prefix, 0) != 0 || f.num_images() != 2) {
      *detail = str_cat("unexpected content: model '", model, "', ", f.num_images(), " images");
      return Seen::Broken;
    }
    *generation = std::stoll(model.substr(prefix.size()));
    for (int64_t i = 0; i < 2; ++i) {
      ImageState st = f.state(i);
      if (st.rows != st.last_step + 1) {
        *detail = str_cat("image ", i, ": ", st.rows, " rows but last_step ", st.last_step);
        return Seen::Broken;
      }
    }
    return Seen::Consistent;
  } catch (const Error& e) {
    *detail = str_cat(e.kind(), ": ", e.what());
    return Seen::Broken;
  }
}

// Issue 16: a reader polling the path while the checkpoint is created must never break the
// writer (it used to take HDF5's file lock between H5Fcreate and H5Fstart_swmr_write) and must
// find either no file or a consistent one. Another process polls with a SWMR reader about every
// millisecond and with a plain H5Fopen about every 5 ms while this one creates, fills a step,
// closes and removes the checkpoint 200 times. Each generation is closed only after the SWMR
// reader has seen it, so every outcome is exercised whatever the speed of the machine; the
// only time limit is a hang guard.
TEST(CheckpointStore, CreationIsAtomicForReadersPollingThePath) {
  TempDir dir;
  const std::string path = dir.path("polled.h5");
  constexpr int kGenerations = 200;
  int to_reader[2], from_reader[2];  // writer -> reader: stop (EOF); reader -> writer: generations seen, then counts
  ASSERT_EQ(::pipe(to_reader), 0);
  ASSERT_EQ(::pipe(from_reader), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    enter_forked_child();
    ::close(to_reader[1]);
    ::close(from_reader[0]);
    h5::silence_errors();
    int64_t counts[2][4] = {};  // [plain, swmr][Seen]
    std::string first_broken, last_seen;
    int64_t reported = -1;
    for (int64_t round = 0;; ++round) {
      struct pollfd stop {to_reader[0], POLLIN, 0};
      if (::poll(&stop, 1, 0) > 0) break;  // EOF: the writer is done
      for (bool swmr : {true, false}) {
        if (!swmr && round % 5 != 0) continue;
        int64_t generation = -1;
        std::string detail;
        Seen seen = poll_once(path, swmr, &generation, &detail);
        ++counts[swmr][static_cast<int>(seen)];
        last_seen = str_cat(swmr ? "SWMR" : "plain", " read: outcome ", static_cast<int>(seen), " ", detail);
        if (seen == Seen::Broken && first_broken.empty()) first_broken = last_seen;
        if (swmr && seen == Seen::Consistent && generation > reported) {
          reported = generation;
          const std::string line = str_cat(generation, "\n");
          if (::write(from_reader[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(4);
        }
      }
      ::usleep(1000);
    }
    std::string summary = "counts";
    for (auto& c : counts)
      for (int64_t n : c) summary += str_cat(" ", n);
    summary += str_cat("\nbroken ", first_broken.empty() ? "-" : first_broken, "\nlast ", last_seen, "\n");
    if (::write(from_reader[1], summary.data(), summary.size()) != static_cast<ssize_t>(summary.size())) ::_exit(4);
    ::_exit(0);
  }
  ::close(to_reader[0]);
  ::close(from_reader[1]);
  FILE* reader_out = ::fdopen(from_reader[0], "r");
  ASSERT_NE(reader_out, nullptr);
  auto next_line = [&](std::string* line) {
    // Hang guard: a line is due within minutes even on a machine far busier than any CI runner.
    struct pollfd p {from_reader[0], POLLIN, 0};
    if (::poll(&p, 1, 300 * 1000) <= 0) return false;
    char buf[4096];
    if (std::fgets(buf, sizeof(buf), reader_out) == nullptr) return false;
    *line = buf;
    if (!line->empty() && line->back() == '\n') line->pop_back();
    return true;
  };

  int writer_failures = 0;
  std::string first_failure, line;
  bool hung = false;
  for (int g = 0; g < kGenerations && !hung; ++g) {
    Job job = tiny_job();
    job.file.model = str_cat("/models/generation-", g);
    try {
      CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
      write_prologue(w, 0);
      const ImageShape& s = w.contents().shape(0);
      w.append_step(0, 0, step_latents(s, 0, 0), step_noise(s, 0, 0));
      // Progress, not time: wait until the reader has seen this generation.
      for (;;) {
        if (!next_line(&line)) {
          hung = true;
          break;
        }
        if (std::stoll(line) >= g) break;
      }
      w.close();
    } catch (const Error& e) {
      if (writer_failures++ == 0) first_failure = str_cat("generation ", g, ": ", e.kind(), ": ", e.what());
    }
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  ::close(to_reader[1]);  // stop the reader; it answers with its counts
  std::string counts_line, broken_line, last_line;
  while (next_line(&line) && line.rfind("counts", 0) != 0) {
  }
  counts_line = line;
  next_line(&broken_line);
  next_line(&last_line);
  std::fclose(reader_out);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_FALSE(hung) << "the SWMR reader stopped reporting generations; " << last_line;
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reader process status " << status;

  EXPECT_EQ(writer_failures, 0) << first_failure;
  int64_t c[2][4] = {};
  std::istringstream in(counts_line.substr(std::string("counts").size()));
  for (auto& row : c)
    for (int64_t& n : row) in >> n;
  ASSERT_FALSE(in.fail()) << "reader summary: '" << counts_line << "'";
  const int64_t plain_total = c[0][0] + c[0][1] + c[0][2] + c[0][3], swmr_total = c[1][0] + c[1][1] + c[1][2] + c[1][3];
  std::cout << "SWMR reader: " << swmr_total << " opens, " << c[1][0] << " not found, " << c[1][1]
            << " not yet readable, " << c[1][2] << " consistent; plain H5Fopen: " << plain_total << " opens, "
            << c[0][0] << " not found, " << c[0][1] << " not yet readable (held by the SWMR writer), " << c[0][2]
            << " consistent\n";
  EXPECT_EQ(c[1][3] + c[0][3], 0) << "reads that found a broken or half-made file; the first: " << broken_line;
  EXPECT_EQ(c[1][1], 0) << "a SWMR reader never finds a file it cannot read yet";
  EXPECT_GE(c[1][2], kGenerations) << "every generation was seen by the SWMR reader";
  EXPECT_GT(plain_total, 0);
  for (const auto& e : std::filesystem::directory_iterator(dir.path("")))
    ADD_FAILURE() << "left behind: " << e.path();
}

// Writer process killed with SIGKILL at various moments of its append loop, then resume() in this
// process: the committed rows are intact, an unfinished row is dropped, appending continues. Small
// rows (2 KiB, packed with metadata) and large ones (128 KiB, chunks of their own).
class KilledWriter : public testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(KilledWriter, IsResumedWithEveryCommittedRowIntact) {
  TempDir dir;
  const std::string path = dir.path("killed.h5");
  const int64_t steps = 100000;  // more than the writer can reach before it is killed
  Job job = tiny_job(steps, GetParam().first, GetParam().second);
  const bool have_h5dump = std::filesystem::exists("/usr/bin/h5dump");
  for (int delay_us : {0, 130, 370, 800, 1500, 2900}) {
    SCOPED_TRACE(str_cat("kill ", delay_us, " us after step 20"));
    std::filesystem::remove(path);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
    enter_forked_child();
      try {
        CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
        write_prologue(w, 0);
        write_prologue(w, 1);
        const ImageShape& s = w.contents().shape(0);
        for (int64_t k = 0; k < steps; ++k)
          for (int64_t i = 0; i < 2; ++i) w.append_step(i, k, step_latents(s, i, k), step_noise(s, i, k));
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    // Watch the live file through a SWMR reader until step 20 is committed, then kill. Progress,
    // not time: the wait ends when step 20 is seen or the writer ends by itself; the only limit is
    // a hang guard (nothing seen changes for 5 minutes), which reports what was seen last.
    bool reached = false, ended = false;
    int status = 0;
    std::string seen = "nothing yet";
    auto changed_at = std::chrono::steady_clock::now();
    while (!reached) {
      std::string now_seen;
      try {
        const int64_t last = CheckpointReader::open(path).state(1).last_step;
        reached = last >= 20;
        now_seen = str_cat("image 1 at last_step ", last);
      } catch (const CheckpointError& e) {  // not created yet
        now_seen = e.what();
      }
      if (reached) break;
      if (now_seen != seen) {
        seen = now_seen;
        changed_at = std::chrono::steady_clock::now();
      }
      if (::waitpid(child, &status, WNOHANG) == child) {
        ended = true;
        break;
      }
      if (std::chrono::steady_clock::now() - changed_at > std::chrono::minutes(5)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!ended) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));  // where in the loop the kill lands
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
    }
    ASSERT_TRUE(reached) << "the writer never reached step 20 (" << (ended ? "it ended" : "no progress for 5 minutes")
                         << "; last seen: " << seen << ")";
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended by itself, exit status " << WEXITSTATUS(status);

    if (have_h5dump && delay_us == 0) {
      std::string out;
      EXPECT_NE(run_command("/usr/bin/h5dump -H " + shell_quote(path), &out), 0)
          << "plain HDF5 readers are expected to refuse a file left open for writing:\n" << out;
    }
    int64_t last[2];
    {
      CheckpointReader r = CheckpointReader::open(path);  // SWMR read of the killed file
      for (int i = 0; i < 2; ++i) {
        last[i] = r.state(i).last_step;
        EXPECT_EQ(r.state(i).rows, last[i] + 1);
      }
    }
    {
      CheckpointWriter w = CheckpointWriter::resume(path, job.file, job.images);
      const CheckpointReader& c = w.contents();
      const ImageShape& s = c.shape(0);
      for (int64_t i = 0; i < 2; ++i) {
        ImageState st = c.state(i);
        EXPECT_EQ(st.status, ImageStatus::Denoising);
        EXPECT_EQ(st.last_step, last[i]);
        EXPECT_EQ(st.rows, last[i] + 1);
        EXPECT_TRUE(identical("latest latents", c.latest_latents(i), step_latents(s, i, last[i])));
        EXPECT_TRUE(identical("stored text", c.text(i).prompt_embeds, text_of(s, i).prompt_embeds));
        for (int64_t k = last[i] + 1; k <= last[i] + 3; ++k) w.append_step(i, k, step_latents(s, i, k), step_noise(s, i, k));
      }
      w.close();
    }
    CheckpointReader r = CheckpointReader::open(path);
    for (int64_t i = 0; i < 2; ++i) {
      std::vector<int64_t> idx = r.step_indices(i);
      ASSERT_EQ(static_cast<int64_t>(idx.size()), last[i] + 4);
      for (int64_t k = 0; k < static_cast<int64_t>(idx.size()); ++k) ASSERT_EQ(idx[k], k);
      for (int64_t k : {int64_t{0}, last[i], last[i] + 1, last[i] + 3}) {
        EXPECT_TRUE(identical(str_cat("steps[", k, "]"), r.row(i, k).latents, step_latents(r.shape(i), i, k)));
        EXPECT_TRUE(identical(str_cat("noise_pred[", k, "]"), r.row(i, k).noise_pred, step_noise(r.shape(i), i, k)));
      }
    }
    if (have_h5dump) {
      std::string out;
      EXPECT_EQ(run_command("/usr/bin/h5dump -H " + shell_quote(path), &out), 0) << "after a clean close:\n" << out;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RowSizes, KilledWriter,
                         testing::Values(std::pair<int64_t, int64_t>{64, 32}, std::pair<int64_t, int64_t>{512, 256}),
                         [](const testing::TestParamInfo<std::pair<int64_t, int64_t>>& p) {
                           return str_cat("image_", p.param.first, "x", p.param.second);
                         });

TEST(CheckpointStore, ResumeRefusesAFileThatALiveWriterHolds) {
  TempDir dir;
  const std::string path = dir.path("held.h5");
  Job job = tiny_job();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    enter_forked_child();
    try {
      CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
      write_prologue(w, 0);
      char c = 1;
      if (::write(ready[1], &c, 1) != 1) ::_exit(4);
      ::pause();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(error_of([&] { CheckpointWriter::resume(path, job.file, job.images); }),
            str_cat("CheckpointError: ", path, ": another process is writing this checkpoint (a running fluxmpi job?); "
                    "wait for it to end or stop it before resuming"));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  CheckpointWriter w = CheckpointWriter::resume(path, job.file, job.images);  // its writer is gone now
  EXPECT_EQ(w.contents().state(0).status, ImageStatus::Denoising);
}

TEST(CheckpointStore, ResumeRefusesAnotherJobNamingTheField) {
  TempDir dir;
  const std::string path = dir.path("job.h5");
  make_finished(path);
  Job other = tiny_job();
  other.images[1].seed = 7;
  EXPECT_EQ(error_of([&] { CheckpointWriter::resume(path, other.file, other.images); }),
            str_cat("CheckpointError: ", path, ": /images/00001: 'seed' is 43 in the checkpoint, the command line asks "
                    "for 7; the checkpoint belongs to another job"));
  EXPECT_EQ(error_of([&] { CheckpointWriter::resume(dir.path("none.h5"), other.file, other.images); }),
            str_cat("UsageError: --resume '", dir.path("none.h5"), "': no such file"));
}

// A run stopped cleanly after step 1 and resumed ends with exactly the file of an uninterrupted run.
TEST(CheckpointStore, ResumedRunEqualsUninterruptedRun) {
  TempDir dir;
  Job job = tiny_job();
  make_finished(dir.path("whole.h5"));
  const std::string path = dir.path("parts.h5");
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    write_prologue(w, 0);
    const ImageShape& s = w.contents().shape(0);
    for (int64_t k = 0; k < 2; ++k) w.append_step(0, k, step_latents(s, 0, k), step_noise(s, 0, k));
  }
  {
    CheckpointWriter w = CheckpointWriter::resume(path, job.file, job.images);
    const CheckpointReader& c = w.contents();
    EXPECT_EQ(c.state(0).last_step, 1);
    EXPECT_EQ(c.state(1).status, ImageStatus::Encoding);
    const ImageShape& s = c.shape(0);
    for (int64_t k = c.state(0).last_step + 1; k < s.steps; ++k)
      w.append_step(0, k, step_latents(s, 0, k), step_noise(s, 0, k));
    w.write_image(0, picture_of(s, 0));
    w.set_status(0, ImageStatus::Decoded);
    write_prologue(w, 1);
    for (int64_t k = 0; k < s.steps; ++k) w.append_step(1, k, step_latents(s, 1, k), step_noise(s, 1, k));
    w.write_image(1, picture_of(s, 1));
    w.set_status(1, ImageStatus::Decoded);
  }
  CheckpointReader a = CheckpointReader::open(dir.path("whole.h5"));
  CheckpointReader b = CheckpointReader::open(path);
  for (int64_t i = 0; i < 2; ++i) {
    for (const DatasetSpec& spec : dataset_specs(a.shape(i))) {
      if (spec.type == StoredType::String) continue;
      EXPECT_TRUE(identical(image_object(i, spec.name), b.dataset(i, spec.name), a.dataset(i, spec.name)));
    }
    EXPECT_EQ(b.state(i).status, ImageStatus::Decoded);
  }
}

}  // namespace
}  // namespace fluxmpi::ckpt
