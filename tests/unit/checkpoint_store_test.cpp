// The HDF5 checkpoint store: writer/reader round trip, the DESIGN.md §5 layout as HDF5's own tools
// show it, a concurrent SWMR reader (h5py), a writer killed with SIGKILL and resumed, and the
// refusals of create() and resume().

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

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
    // Watch the live file through a SWMR reader until step 20 is committed, then kill.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool reached = false;
    while (!reached && std::chrono::steady_clock::now() < deadline) {
      try {
        reached = CheckpointReader::open(path).state(1).last_step >= 20;
      } catch (const CheckpointError&) {  // not created yet, or still being created
      }
      if (!reached) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(reached) << "the writer never reached step 20";
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
