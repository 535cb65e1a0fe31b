// The `fluxmpi` command as a user sees it, one process: version, truncation warnings quoting the
// dropped text once per tokenizer, progress records in batch logs, the stage summary, PNG text
// chunks, a random seed printed and stored, and --dry-run writing nothing.

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <regex>

#include "io/png.h"
#include "support/fixtures.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;

struct CommandRun {
  int code;
  std::string out;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

CommandRun fluxmpi(const std::vector<std::string>& args) {
  std::string cmd = quote(std::string(FLUXMPI_BINARY_DIR) + "/fluxmpi") + " --threads 1";
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " 2>&1 < /dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class Command : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fluxmpi-command-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string model() const { return test::fixture_root() + "/tiny-flux-dev"; }
  fs::path dir_;
};

TEST_F(Command, Version) {
  CommandRun r = fluxmpi({"--version"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("fluxmpi 0.1.0"), std::string::npos) << r.out;
}

TEST_F(Command, LongPromptWarnsOncePerTokenizerQuotingTheDroppedText) {
  FLUXMPI_REQUIRE_FIXTURES();
  const std::string prompt =
      "A sprawling fantasy city built on the back of a giant sea turtle, drifting across a calm turquoise ocean at "
      "golden hour; terraced gardens cascade down its shell, with tiny lanterns glowing between cherry trees, wooden "
      "bridges, windmills, and narrow stone stairways; seagulls circle above copper domes while fishing boats with "
      "patched red sails gather near the turtle's flippers; in the foreground a young cartographer sketches.";
  CommandRun r = fluxmpi({"--model", model(), "--prompt", prompt, "--num-images", "2", "--height", "32", "--width", "32",
                   "--steps", "1", "--seed", "1", "--max-sequence-length", "64", "-o", (dir_ / "long.png").string()});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "the CLIP tokenizer keeps 75 tokens"), 1u) << r.out;
  EXPECT_EQ(count(r.out, "the T5 tokenizer keeps 63 tokens"), 1u) << r.out;
  EXPECT_NE(r.out.find("young cartographer sketches.\""), std::string::npos) << "the dropped tail is quoted:\n" << r.out;
}

TEST_F(Command, BatchLogProgressSummaryAndPngMetadata) {
  FLUXMPI_REQUIRE_FIXTURES();
  const std::string png = (dir_ / "cat.png").string();
  CommandRun r = fluxmpi({"--model", model(), "--prompt", "a photo of a cat", "--height", "64", "--width", "64", "--steps", "4",
                   "--seed", "0", "-o", png});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("progress: 1/4 steps (25%)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("progress: 4/4 steps (100%)"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("summary: validate .* encode .* load .* denoise .* decode .*peak RSS")))
      << r.out;
  std::vector<std::pair<std::string, std::string>> text;
  io::RgbImage img = io::read_png(png, &text);
  EXPECT_EQ(img.height, 64);
  std::map<std::string, std::string> meta(text.begin(), text.end());
  EXPECT_EQ(meta["prompt"], "a photo of a cat");
  EXPECT_EQ(meta["seed"], "0");
  EXPECT_EQ(meta["steps"], "4");
  EXPECT_EQ(meta["guidance"], "3.5");
  EXPECT_EQ(meta["size"], "64x64");
  EXPECT_EQ(meta["model"], model());
  EXPECT_EQ(meta["software"], "fluxmpi 0.1.0");
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().rfind(".fluxmpi-tmp", 0), std::string::npos) << "temporary file left: " << e.path();
}

TEST_F(Command, RandomSeedIsPrintedAndStored) {
  FLUXMPI_REQUIRE_FIXTURES();
  const std::string png = (dir_ / "seed.png").string();
  CommandRun r = fluxmpi({"--model", model(), "--prompt", "x", "--height", "32", "--width", "32", "--steps", "1", "-o", png, "--no-progress"});
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("no --seed given: using seed (\\d+)"))) << r.out;
  std::vector<std::pair<std::string, std::string>> text;
  io::read_png(png, &text);
  std::map<std::string, std::string> meta(text.begin(), text.end());
  EXPECT_EQ(meta["seed"], m[1].str());
}

TEST_F(Command, DryRunPrintsThePlanAndWritesNothing) {
  FLUXMPI_REQUIRE_FIXTURES();
  CommandRun r = fluxmpi({"--model", model(), "--dry-run", "--height", "256", "--width", "256", "-o", (dir_ / "x.png").string(),
                   "--checkpoint", (dir_ / "x.h5").string()});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("double 0-1, single 0-2"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_empty(dir_)) << "--dry-run must not write";
}

}  // namespace
}  // namespace fluxmpi::app
