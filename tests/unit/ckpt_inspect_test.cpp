// fluxmpi-inspect run as a user runs it, on synthetic checkpoints: summary, --stats, --preview,
// --diff exit codes, --follow on a live writer, errors and exit codes; and --decode of every
// pipeline case of the fixture manifest against diffusers' image.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <future>
#include <regex>
#include <sstream>
#include <thread>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "core/error.h"
#include "io/json_config.h"
#include "io/png.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"
#include "unit/ckpt_test_job.h"

namespace fluxmpi::ckpt {
namespace {
using namespace test;

std::string inspect_exe() { return std::string(FLUXMPI_BINARY_DIR) + "/tools/inspect/fluxmpi-inspect"; }

#define FLUXMPI_REQUIRE_INSPECT()                                                                    \
  do {                                                                                               \
    if (!std::filesystem::exists(inspect_exe())) {                                                   \
      const char* ci = std::getenv("CI");                                                            \
      if (ci != nullptr && std::string(ci) == "true") FAIL() << inspect_exe() << " was not built";   \
      GTEST_SKIP() << inspect_exe() << " not built (cmake --build ... --target fluxmpi-inspect)";     \
    }                                                                                                \
  } while (0)

struct ToolRun {
  int code = -1;
  std::string out;  // stdout and stderr
};
ToolRun inspect(const std::string& args) {
  ToolRun r;
  r.code = run_command(inspect_exe() + " " + args, &r.out);
  return r;
}

// The line of `out` that starts with `prefix` (after leading spaces), or "".
std::string line_starting(const std::string& out, const std::string& prefix) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    size_t b = line.find_first_not_of(' ');
    if (b != std::string::npos && line.compare(b, prefix.size(), prefix) == 0) return line;
  }
  return "";
}

class Inspect : public testing::Test {
 protected:
  void SetUp() override {
    FLUXMPI_REQUIRE_INSPECT();
    path_ = dir_.path("run.h5");
    make_finished(path_);
  }
  TempDir dir_;
  std::string path_;
};

TEST_F(Inspect, SummaryShowsOneLinePerImage) {
  ToolRun r = inspect(shell_quote(path_));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(path_ + ": fluxmpi checkpoint, format 1, written by fluxmpi "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model: /models/tiny-flux (1 double + 2 single blocks, 2 x 16 heads, guidance embedding)"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(image +status +steps +seed +size +dtype +prompt)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\n00000 +decoded +4/4 +42 +64x32 +fp32 +"a photo of a cat"\n)")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\n00001 +decoded +4/4 +43 +64x32 +fp32 +"ein Hund im Schnee, 犬"\n)")))
      << r.out;
  ToolRun one = inspect(shell_quote(path_) + " --image 1");
  EXPECT_EQ(one.out.find("\n00000 "), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("\n00001 "), std::string::npos) << one.out;
}

TEST_F(Inspect, SummaryShortensLongPromptsAndShowsProgress) {
  const std::string path = dir_.path("partial.h5");
  Job job = tiny_job(6);
  job.images[0].prompt = "A sprawling fantasy city built on the back of a giant sea turtle at golden hour";
  CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
  write_prologue(w, 0);
  const ImageShape& s = w.contents().shape(0);
  for (int64_t k = 0; k < 3; ++k) w.append_step(0, k, step_latents(s, 0, k), step_noise(s, 0, k));
  w.flush();
  ToolRun r = inspect(shell_quote(path));  // read while the writer holds the file (SWMR)
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"A sprawling fantasy city built on the back of a…\""), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\n00000 +denoising +3/6 +42)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\n00001 +encoding +0/6 +43)"))) << r.out;
}

TEST_F(Inspect, StatsGivesSigmaAndMomentsOfEveryStoredStep) {
  ToolRun r = inspect(shell_quote(path_) + " --stats --image 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("/images/00000  \"a photo of a cat\"  64x32, decoded, step 4/4, 4 row(s) stored"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(step +sigma +mean +std +min +max +L2 norm)"))) << r.out;
  CheckpointReader reader = CheckpointReader::open(path_);
  const ImageShape& s = reader.shape(0);
  at::Tensor sigmas = sigmas_of(s);
  for (int64_t k = -1; k < 4; ++k) {
    std::string line = line_starting(r.out, k < 0 ? "init " : std::to_string(k) + " ");
    ASSERT_FALSE(line.empty()) << "no row for step " << k << " in\n" << r.out;
    std::istringstream in(line);
    std::string label;
    double sigma, mean, sd, mn, mx, l2;
    in >> label >> sigma >> mean >> sd >> mn >> mx >> l2;
    at::Tensor x = step_latents(s, 0, k).to(at::kDouble);
    const double want_sigma = sigmas[k + 1 < 0 ? 0 : k + 1].item<double>();
    EXPECT_NEAR(sigma, want_sigma, 1e-6) << line;
    EXPECT_NEAR(mean, x.mean().item<double>(), 1e-5 * (1 + std::abs(x.mean().item<double>()))) << line;
    EXPECT_NEAR(sd, x.std(false).item<double>(), 1e-5 * x.std(false).item<double>()) << line;
    EXPECT_NEAR(mn, x.min().item<double>(), 1e-5 * std::abs(x.min().item<double>())) << line;
    EXPECT_NEAR(mx, x.max().item<double>(), 1e-5 * std::abs(x.max().item<double>())) << line;
    EXPECT_NEAR(l2, x.norm().item<double>(), 1e-5 * x.norm().item<double>()) << line;
  }
  ToolRun one = inspect(shell_quote(path_) + " --stats --image 0 --step 2");
  EXPECT_FALSE(line_starting(one.out, "2 ").empty()) << one.out;
  EXPECT_TRUE(line_starting(one.out, "1 ").empty()) << one.out;
  EXPECT_TRUE(line_starting(one.out, "init ").empty()) << one.out;
}

TEST_F(Inspect, PreviewWritesAnImageSizedPngOfX0OrTheNoisyLatents) {
  auto preview = [&](const std::string& args) {
    std::string png = dir_.path("p.png");
    std::filesystem::remove(png);
    ToolRun r = inspect(shell_quote(path_) + " --preview " + shell_quote(png) + " " + args);
    EXPECT_EQ(r.code, 0) << r.out;
    return io::read_png(png);
  };
  io::RgbImage x0 = preview("--image 1 --step 1");
  ASSERT_EQ(x0.height, 64);
  ASSERT_EQ(x0.width, 32);
  // One latent cell per 8 x 8 block (nearest upscaling to the image size).
  for (int64_t y = 0; y < 64; ++y)
    for (int64_t x = 0; x < 32; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(x0.pixels[(y * 32 + x) * 3 + c], x0.pixels[((y / 8 * 8) * 32 + x / 8 * 8) * 3 + c]) << y << "," << x;
  io::RgbImage noisy = preview("--image 1 --step 1 --latent noisy");
  EXPECT_NE(x0.pixels, noisy.pixels) << "sigma_2 > 0: x0 and the noisy latents differ";
  // After the last step sigma is 0, so x0 is the final latent itself.
  EXPECT_EQ(preview("--image 1").pixels, preview("--image 1 --step 3 --latent noisy").pixels);
  EXPECT_NE(preview("--image 1 --step -1").pixels, noisy.pixels);

  std::vector<std::pair<std::string, std::string>> text;
  std::string png = dir_.path("t.png");
  ASSERT_EQ(inspect(shell_quote(path_) + " --preview " + shell_quote(png)).code, 0);
  io::read_png(png, &text);
  std::map<std::string, std::string> chunks(text.begin(), text.end());
  EXPECT_EQ(chunks["Latents"], "x0 predicted at step 3 (sigma 0)");
  EXPECT_EQ(chunks["Image"], "/images/00000");

  ToolRun missing = inspect(shell_quote(path_) + " --preview " + shell_quote(png) + " --step 7");
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("fluxmpi-inspect: UsageError: --step 7: /images/00000 has no stored row for step 7 "
                             "(stored steps: 0, 1, 2, 3; -1 = the initial noise)"),
            std::string::npos)
      << missing.out;
}

TEST_F(Inspect, DiffExitCodesFollowTheTolerance) {
  const std::string same = dir_.path("same.h5");
  make_finished(same);
  ToolRun r = inspect(shell_quote(path_) + " --diff " + shell_quote(same));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("within tolerance"), std::string::npos) << r.out;

  // One row of image 0 off by a relative 1e-3 of its largest value.
  const std::string other = dir_.path("other.h5");
  Job job = tiny_job();
  {
    CheckpointWriter w = CheckpointWriter::create(other, job.file, job.images);
    for (int64_t i = 0; i < 2; ++i) {
      const ImageShape& s = w.contents().shape(i);
      write_prologue(w, i);
      for (int64_t k = 0; k < 4; ++k) {
        at::Tensor x = step_latents(s, i, k);
        if (i == 0 && k == 2) x = x + 1e-3 * x.abs().max();
        w.append_step(i, k, x, step_noise(s, i, k));
      }
      w.write_image(i, picture_of(s, i));
      w.set_status(i, ImageStatus::Decoded);
    }
  }
  at::Tensor original = CheckpointReader::open(path_).dataset(0, "latents/steps");
  at::Tensor changed = CheckpointReader::open(other).dataset(0, "latents/steps");
  ToolRun above = inspect(shell_quote(other) + " --diff " + shell_quote(path_) + " --tol 1e-4");
  EXPECT_EQ(above.code, 1) << above.out;
  std::string line = line_starting(above.out, "/images/00000/latents/steps ");
  EXPECT_NE(line.find("ABOVE TOLERANCE"), std::string::npos) << above.out;
  std::istringstream in(line);
  std::string name;
  double abs = 0, rel = 0;
  in >> name >> abs >> rel;
  fluxmpi::test::Closeness c = fluxmpi::test::closeness(changed, original);
  EXPECT_NEAR(abs, c.max_abs_diff, 1e-3 * c.max_abs_diff) << line;
  EXPECT_NEAR(rel, c.relative, 1e-3 * c.relative) << line;
  EXPECT_TRUE(line_starting(above.out, "/images/00000/latents/noise_pred ").find("ABOVE") == std::string::npos);
  EXPECT_EQ(inspect(shell_quote(other) + " --diff " + shell_quote(path_) + " --tol 1e-2").code, 0);
  EXPECT_EQ(inspect(shell_quote(other) + " --diff " + shell_quote(path_) + " --image 1").code, 0);

  // A run stopped earlier: fewer rows is a difference of shape, and of status.
  const std::string shorter = dir_.path("shorter.h5");
  {
    CheckpointWriter w = CheckpointWriter::create(shorter, job.file, job.images);
    write_prologue(w, 0);
    const ImageShape& s = w.contents().shape(0);
    w.append_step(0, 0, step_latents(s, 0, 0), step_noise(s, 0, 0));
  }
  ToolRun rows = inspect(shell_quote(shorter) + " --diff " + shell_quote(path_) + " --image 0 --tol 1");
  EXPECT_EQ(rows.code, 1) << rows.out;
  EXPECT_NE(line_starting(rows.out, "/images/00000/latents/steps ").find("shape [1, 8, 64] vs [4, 8, 64]: DIFFERENT"),
            std::string::npos)
      << rows.out;
  EXPECT_NE(line_starting(rows.out, "/images/00000/status ").find("'denoising' vs 'decoded': DIFFERENT"),
            std::string::npos)
      << rows.out;
}

TEST_F(Inspect, ErrorsAndExitCodes) {
  const std::string text = dir_.path("notes.txt");
  std::ofstream(text) << "hello";
  ToolRun bad = inspect(shell_quote(text));
  EXPECT_EQ(bad.code, 3);
  EXPECT_EQ(bad.out, str_cat("fluxmpi-inspect: CheckpointError: ", text, ": not an HDF5 file (no HDF5 signature)\n"));
  ToolRun missing = inspect(shell_quote(dir_.path("nothing.h5")));
  EXPECT_EQ(missing.code, 3) << missing.out;
  ToolRun diff_bad = inspect(shell_quote(path_) + " --diff " + shell_quote(text));
  EXPECT_EQ(diff_bad.code, 3) << diff_bad.out;

  for (const char* args : {"", "--decode x.png", "--model /m", "--tol 1", "--latent x0", "--step 1",
                           "--image 2", "--image -1", "--follow --stats", "--timeout 3", "--latent blurry --preview p.png",
                           "--diff a.h5 --stats", "--no-such-option", "--step"}) {
    ToolRun r = inspect(std::string(*args == '\0' ? "" : shell_quote(path_) + " ") + args);
    EXPECT_EQ(r.code, 2) << "'" << args << "': " << r.out;
    EXPECT_EQ(r.out.rfind("fluxmpi-inspect: UsageError: ", 0), 0u) << "'" << args << "': " << r.out;
  }
  EXPECT_EQ(inspect(shell_quote(path_) + " --image 2").out,
            str_cat("fluxmpi-inspect: UsageError: --image 2: ", path_, " holds images 0..1\n"));
  ToolRun help = inspect("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("Exit codes: 0 ok, 1 --diff above tolerance"), std::string::npos) << help.out;
}

// --follow started before the job creates its checkpoint, while this process writes it. Paced by
// progress, not time: each change is made only once the tool has printed the previous one, so
// every line must appear, in order, however fast or slow the machine; the waits have a hang
// guard only (the tool's own --timeout and 5 minutes per line here).
TEST_F(Inspect, FollowPrintsProgressUntilEveryImageIsDecoded) {
  const std::string path = dir_.path("live.h5");
  const std::string log = dir_.path("follow.log");
  std::future<ToolRun> follower = std::async(std::launch::async, [&] {
    return inspect(shell_quote(path) + " --follow --interval 0.05 --timeout 800 > " + shell_quote(log));
  });
  auto log_text = [&] {
    std::ifstream in(log);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  // Waits until the log holds `want` after offset `*at` (then moves `*at` past it); false if the
  // tool ended or printed nothing new for 5 minutes.
  size_t at = 0;
  auto wait_for_line = [&](const std::string& want) {
    std::string seen = log_text();
    auto changed_at = std::chrono::steady_clock::now();
    for (;;) {
      size_t found = seen.find(want, at);
      if (found != std::string::npos) {
        at = found + want.size();
        return true;
      }
      if (follower.wait_for(std::chrono::milliseconds(20)) == std::future_status::ready) {
        seen = log_text();
        found = seen.find(want, at);
        if (found == std::string::npos) return false;
        at = found + want.size();
        return true;
      }
      std::string now = log_text();
      if (now != seen) {
        seen = now;
        changed_at = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - changed_at > std::chrono::minutes(5)) {
        return false;
      }
    }
  };
  ASSERT_TRUE(wait_for_line("waiting: " + path + ": no such file")) << log_text();
  Job job = tiny_job();
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    ASSERT_TRUE(wait_for_line("/images/00000 encoding\n")) << log_text();
    for (int64_t i = 0; i < 2; ++i) {
      const ImageShape& s = w.contents().shape(i);
      const std::string group = image_group(i);
      write_prologue(w, i);
      ASSERT_TRUE(wait_for_line(group + " denoising, step 0/4\n")) << log_text();
      for (int64_t k = 0; k < 4; ++k) {
        w.append_step(i, k, step_latents(s, i, k), step_noise(s, i, k));
        ASSERT_TRUE(wait_for_line(str_cat(group, " denoising, step ", k + 1, "/4\n"))) << log_text();
      }
      w.write_image(i, picture_of(s, i));
      w.set_status(i, ImageStatus::Decoded);
      if (i == 0) ASSERT_TRUE(wait_for_line(group + " decoded\n")) << log_text();
    }
  }
  ToolRun r = follower.get();
  r.out = log_text() + r.out;
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("/images/00001 decoded\ndone: 2 of 2 image(s) decoded\n", at), std::string::npos) << r.out;

  const std::string stuck = dir_.path("stuck.h5");
  CheckpointWriter w = CheckpointWriter::create(stuck, job.file, job.images);
  ToolRun t = inspect(shell_quote(stuck) + " --follow --interval 0.05 --timeout 0.3");
  EXPECT_EQ(t.code, 1) << t.out;
  EXPECT_NE(t.out.find("timeout after 0.3 s: 0 of 2 image(s) decoded"), std::string::npos) << t.out;
}

// --decode of the final latents of every pipeline case must give diffusers' image: the checkpoint
// holds the case's rows, the model is the case's tiny pipeline.
class InspectDecode : public testing::TestWithParam<fluxmpi::test::CaseRef> {};

TEST_P(InspectDecode, FinalStepDecodesToTheReferenceImage) {
  const fluxmpi::test::CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  FLUXMPI_REQUIRE_INSPECT();
  fluxmpi::test::CaseTensors ref(c.file);
  at::Tensor steps = ref.get("latents_steps"), noise = ref.get("noise_pred"), images = ref.get("image_uint8");
  const int64_t n_steps = steps.size(0), n_img = steps.size(1);
  const nlohmann::json& call = c.json["call"];

  Job job;
  job.file.model = c.model_dir;
  job.file.model_config = io::read_file(c.model_dir + "/transformer/config.json", "transformer config");
  job.file.vae_scale_factor = 8;
  for (int64_t i = 0; i < n_img; ++i) {
    ImageAttributes a;
    a.prompt = call["prompt"].get<std::string>();
    a.seed = call["seed"].is_array() ? call["seed"][i].get<int64_t>() : call["seed"].get<int64_t>() + i;
    a.height = c.json["output_hw"][0].get<int64_t>();
    a.width = c.json["output_hw"][1].get<int64_t>();
    a.num_inference_steps = n_steps;
    a.guidance_scale = call.value("guidance_scale", 3.5);
    a.max_sequence_length = call.value("max_sequence_length", 512);
    a.dtype = "fp32";
    job.images.push_back(a);
  }
  TempDir dir;
  const std::string path = dir.path("case.h5");
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    for (int64_t i = 0; i < n_img; ++i) {
      w.write_initial(i, ref.get("latents_initial")[i]);
      w.write_schedule(i, ref.get("timesteps"), ref.get("sigmas"));
      for (int64_t k = 0; k < n_steps; ++k) w.append_step(i, k, steps[k][i], noise[k][i]);
    }
  }
  for (int64_t i = 0; i < n_img; ++i) {
    const std::string png = dir.path(str_cat("decoded-", i, ".png"));
    ToolRun r = inspect(shell_quote(path) + " --image " + std::to_string(i) + " --decode " + shell_quote(png) +
                    " --model " + shell_quote(c.model_dir));
    ASSERT_EQ(r.code, 0) << r.out;
    io::RgbImage img = io::read_png(png);
    at::Tensor got = at::from_blob(img.pixels.data(), {img.height, img.width, 3}, at::kByte).to(at::kInt);
    at::Tensor want = images[i].to(at::kInt);
    ASSERT_EQ(got.sizes(), want.sizes()) << fluxmpi::test::case_label(c);
    const int64_t max_diff = (got - want).abs().max().item<int64_t>();
    const double identical = got.eq(want).to(at::kDouble).mean().item<double>();
    // As check-cli.sh accepts the PNG of a whole run: max pixel difference 1, >= 99 % identical.
    EXPECT_LE(max_diff, 1) << fluxmpi::test::case_label(c) << " image " << i << " (" << identical * 100 << " % identical)";
    EXPECT_GE(identical, 0.99) << fluxmpi::test::case_label(c) << " image " << i << ": max pixel diff " << max_diff;
    if (const char* env = std::getenv("FLUXMPI_PRINT_ERRORS"); env && std::string(env) == "1")
      std::printf("  measured %s image %lld: max pixel diff %lld, %.4f identical\n", fluxmpi::test::case_label(c).c_str(),
                  static_cast<long long>(i), static_cast<long long>(max_diff), identical);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, InspectDecode, testing::ValuesIn(fluxmpi::test::cases_of_kind("pipeline")),
                         fluxmpi::test::case_test_name);

}  // namespace
}  // namespace fluxmpi::ckpt
