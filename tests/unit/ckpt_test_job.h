#pragma once
// A small synthetic checkpoint job shared by the checkpoint tests: two images (the second with
// true CFG), deterministic tensors whose values encode image, step and position, so that any row
// read back can be checked against what was written.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_writer.h"
#include "ckpt/format.h"
#include "core/error.h"

namespace fluxmpi::ckpt::test {

inline const char* kTinyTransformerConfig = R"({
  "_class_name": "FluxTransformer2DModel", "in_channels": 64, "num_layers": 1, "num_single_layers": 2,
  "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32,
  "pooled_projection_dim": 24, "guidance_embeds": true, "axes_dims_rope": [4, 6, 6]
})";

struct Job {
  FileAttributes file;
  std::vector<ImageAttributes> images;
};

/// 2 images of 64 x 32 pixels (latent 8 x 4, L_img = 8) unless given, `steps` steps, S = 16.
inline Job tiny_job(int64_t steps = 4, int64_t height = 64, int64_t width = 32) {
  Job job;
  job.file.model = "/models/tiny-flux";
  job.file.model_config = kTinyTransformerConfig;
  job.file.vae_scale_factor = 8;
  for (int i = 0; i < 2; ++i) {
    ImageAttributes a;
    a.prompt = i == 0 ? "a photo of a cat" : "ein Hund im Schnee, 犬";
    a.prompt_2 = i == 0 ? "" : "dog, snow";
    a.negative_prompt = i == 0 ? "" : "blurry";
    a.seed = 42 + i;
    a.height = height;
    a.width = width;
    a.num_inference_steps = steps;
    a.guidance_scale = 3.5;
    a.true_cfg_scale = i == 0 ? 1.0 : 2.0;
    a.max_sequence_length = 16;
    a.dtype = "fp32";
    job.images.push_back(a);
  }
  return job;
}

/// A [rows, cols] tensor with values that identify (tag, image, step) and the element.
inline at::Tensor pattern(std::vector<int64_t> shape, int64_t tag, int64_t image, int64_t step) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  at::Tensor base = at::arange(n, at::kDouble).reshape(shape);
  return (at::sin(base * 0.37 + tag * 1.3 + image * 0.71 + step * 0.11) * (1.0 + step)).to(at::kFloat);
}

/// The dataset spec named `name`, or nullptr.
inline const DatasetSpec* find(const std::vector<DatasetSpec>& specs, const std::string& name) {
  for (const DatasetSpec& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

/// Image i's shape as the checkpoint derives it from the job's attributes.
inline ImageShape shape_of(const Job& job, int64_t i) {
  return image_shape(stored_transformer_config(job.file.model_config, "config"), job.file, job.images[i], "img");
}

/// What check_matches says of `asked` (image 0 changed by `change`) against `stored`: its message,
/// or "no difference".
inline std::string resume_difference(const Job& stored, Job asked, const std::function<void(ImageAttributes&)>& change) {
  change(asked.images[0]);
  try {
    check_matches("run.h5", stored.file, stored.images, asked.file, asked.images);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "no difference";
}

inline TextEmbeddings text_of(const ImageShape& s, int64_t image) {
  TextEmbeddings t;
  t.prompt_embeds = pattern({s.text_tokens, s.joint_attention_dim}, 1, image, 0);
  t.pooled_prompt_embeds = pattern({s.pooled_projection_dim}, 2, image, 0);
  t.clip_input_ids = at::arange(kClipTokens, at::kLong) + 49000 + image;
  t.t5_input_ids = at::arange(s.prompt_tokens, at::kLong) * 7 + image;
  if (s.true_cfg) {
    t.negative_prompt_embeds = pattern({s.text_tokens, s.joint_attention_dim}, 3, image, 0);
    t.negative_pooled_prompt_embeds = pattern({s.pooled_projection_dim}, 4, image, 0);
  }
  return t;
}
inline at::Tensor step_latents(const ImageShape& s, int64_t image, int64_t step) {
  return pattern({s.image_tokens, s.token_dim}, 5, image, step);
}
inline at::Tensor step_noise(const ImageShape& s, int64_t image, int64_t step) {
  return pattern({s.image_tokens, s.token_dim}, 6, image, step);
}
inline at::Tensor sigmas_of(const ImageShape& s) {
  return at::cat({at::linspace(1.0, 1.0 / s.steps, s.steps, at::kFloat), at::zeros({1}, at::kFloat)});
}
inline io::RgbImage picture_of(const ImageShape& s, int64_t image) {
  io::RgbImage img;
  img.height = s.height;
  img.width = s.width;
  for (int64_t k = 0; k < s.height * s.width * 3; ++k) img.pixels.push_back(static_cast<uint8_t>((k * 7 + image) % 256));
  return img;
}

/// Stage 1 and the schedule of image i, then status "denoising".
inline void write_prologue(CheckpointWriter& w, int64_t i,
                           const std::function<void(TextEmbeddings&)>& add_text = {}) {
  const ImageShape& s = w.contents().shape(i);
  TextEmbeddings t = text_of(s, i);
  if (add_text) add_text(t);
  w.write_text(i, t);
  at::Tensor sigmas = sigmas_of(s);
  w.write_schedule(i, sigmas.slice(0, 0, s.steps) * 1000, sigmas);
  w.write_initial(i, step_latents(s, i, -1));
  w.set_status(i, ImageStatus::Denoising);
}

/// The whole job: every `every`-th step (and always the last), the image, status "decoded".
inline void write_job(CheckpointWriter& w, int64_t every = 1, const std::function<void(TextEmbeddings&)>& add_text = {}) {
  for (int64_t i = 0; i < w.num_images(); ++i) {
    const ImageShape& s = w.contents().shape(i);
    write_prologue(w, i, add_text);
    for (int64_t k = 0; k < s.steps; ++k)
      if ((k + 1) % every == 0 || k == s.steps - 1) w.append_step(i, k, step_latents(s, i, k), step_noise(s, i, k));
    w.write_image(i, picture_of(s, i));
    w.set_status(i, ImageStatus::Decoded);
  }
}

/// A fresh path in a per-process temporary directory (removed by the caller's TempDir).
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fluxmpi-ckpt-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

/// A finished checkpoint of tiny_job() at `path`.
inline void make_finished(const std::string& path, int64_t steps = 4) {
  Job job = tiny_job(steps);
  CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
  write_job(w);
  w.close();
}

/// Runs a shell command; returns its exit status and fills `out` with stdout + stderr.
inline int run_command(const std::string& command, std::string* out) {
  out->clear();
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// /usr/bin/python3 with h5py (the `python3` first on PATH may lack it).
inline bool have_h5py() {
  std::string out;
  return run_command("/usr/bin/python3 -c 'import h5py, numpy'", &out) == 0;
}

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace fluxmpi::ckpt::test

/// Skips without /usr/bin/python3 + h5py (fails under CI=true, where it must be installed).
#define FLUXMPI_REQUIRE_H5PY()                                                                      \
  do {                                                                                              \
    if (!::fluxmpi::ckpt::test::have_h5py()) {                                                     \
      const char* ci = std::getenv("CI");                                                           \
      if (ci != nullptr && std::string(ci) == "true") FAIL() << "/usr/bin/python3 with h5py is required"; \
      GTEST_SKIP() << "/usr/bin/python3 with h5py and numpy not found (Debian: python3-h5py)";     \
    }                                                                                               \
  } while (0)
