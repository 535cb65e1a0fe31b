// The tiled VAE decode spread over the ranks (pipeline/tile_decode.h): `mpirun -np P fluxmpi
// --vae-tiling` on 2 and 3 ranks writes the same PNG pixels and checkpoint images, bit for bit, as
// the one-rank tiled decode, with microbatched passes (a pass of 2 images and one of 1), with
// --vae-slicing, for FLUX.2's VAE, and with --stages 2 on 4 ranks (each pipeline's leader spreads
// its images' tiles over its own ranks); the helpers' log lines show for whom they decoded tiles.
// Models: make-tiny-model --preset tiny (VAE sample_size 32: a 64-px image is 9 tiles) and the
// FLUX.2 klein fixture with its VAE's sample_size set to 32. --threads 1, fp32.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "ckpt/checkpoint_reader.h"
#include "job_runner.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::test {
namespace fs = std::filesystem;
namespace {

at::Tensor checkpoint_image(const std::string& file, int64_t i) {
  const io::RgbImage img = ckpt::CheckpointReader::open(file).image(i);
  return at::tensor(std::vector<int64_t>(img.pixels.begin(), img.pixels.end())).reshape({img.height, img.width, 3});
}

// The ranks whose debug line says they decoded tiles for a leader, and that leader.
std::map<int, int> leaders_helped(const std::string& output) {
  std::map<int, int> helped;
  static const std::regex line(R"(fluxmpi\[rank (\d+)/\d+\]: decoded ([1-9]\d*) VAE tile\(s\) for rank (\d+))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it)
    helped[std::stoi((*it)[1].str())] = std::stoi((*it)[3].str());
  return helped;
}

// The ranks that decoded tiles for rank 0.
std::vector<int> helpers_in(const std::string& output) {
  std::vector<int> ranks;
  for (const auto& [helper, leader] : leaders_helped(output))
    if (leader == 0) ranks.push_back(helper);
  return ranks;
}

// "N work group(s) taken" of each pipeline leader (--stages, --log-level debug).
std::map<int, int> groups_taken(const std::string& output) {
  std::map<int, int> taken;
  static const std::regex re(R"(fluxmpi\[rank (\d+)/\d+\]: .*?(\d+) work group\(s\) taken)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it)
    taken[std::stoi((*it)[1].str())] = std::stoi((*it)[2].str());
  return taken;
}

class TiledDecode : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("tiled-decode");
    JobResult r = run_program(make_tiny_model_bin(), {"--out", *dir_ / "model", "--preset", "tiny"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::vector<std::string> args(const std::string& tag, const std::string& model, int images,
                                       std::vector<std::string> extra) {
    std::vector<std::string> a = {"--model", model, "--prompt", "a harbour at noon", "--num-images", std::to_string(images),
                                  "--height", "64", "--width", "64", "--steps", "2", "--seed", "11", "--no-progress",
                                  "--dtype", "fp32", "--vae-tiling", "--log-level", "debug", "--checkpoint",
                                  *dir_ / (tag + ".h5"), "-o", *dir_ / (tag + "-{i}.png")};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // The job `t` wrote the latent rows, PNGs and checkpoint images of the job `ref`, bit for bit.
  static void expect_same_job(const std::string& t, const std::string& ref, int images) {
    EXPECT_TRUE(identical(t + ": latents/steps", all_latent_rows(*dir_ / (t + ".h5")), all_latent_rows(*dir_ / (ref + ".h5"))));
    for (int i = 0; i < images; ++i) {
      char png[32];
      std::snprintf(png, sizeof png, "-%05d.png", i);
      EXPECT_TRUE(identical(t + ": PNG " + png, png_pixels(*dir_ / (t + png)), png_pixels(*dir_ / (ref + png))));
      EXPECT_TRUE(identical(t + ": checkpoint image " + std::to_string(i), checkpoint_image(*dir_ / (t + ".h5"), i),
                            checkpoint_image(*dir_ / (ref + ".h5"), i)));
    }
  }

  // P = 1, 2, 3: the same pixels in every PNG and every checkpoint image; ranks 1.. helped.
  static void same_on_every_rank_count(const std::string& tag, const std::string& model, int images,
                                       const std::vector<std::string>& extra) {
    JobResult one = run_fluxmpi(1, args(tag + "1", model, images, extra));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    EXPECT_TRUE(helpers_in(one.output).empty()) << one.output;
    for (int ranks : {2, 3}) {
      const std::string t = tag + std::to_string(ranks);
      JobResult r = run_fluxmpi(ranks, args(t, model, images, extra));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      std::vector<int> expected;
      for (int h = 1; h < ranks; ++h) expected.push_back(h);
      EXPECT_EQ(helpers_in(r.output), expected) << r.output;
      expect_same_job(t, tag + "1", images);
    }
  }

  static TempDir* dir_;
};
TempDir* TiledDecode::dir_ = nullptr;

TEST_F(TiledDecode, MicrobatchedPassesGiveTheOneRankBits) {
  // Three images in passes of 2 and 1 (the last microbatch).
  same_on_every_rank_count("mb", *dir_ / "model", 3, {"--microbatch", "2"});
}

TEST_F(TiledDecode, SlicedPassesGiveTheOneRankBits) {
  same_on_every_rank_count("sl", *dir_ / "model", 2, {"--microbatch", "2", "--vae-slicing"});
}

// --stages 2 on 4 ranks: each leader spreads the tiles of its own images over its own pipeline
// (rank 1 helps rank 0, rank 3 helps rank 2), and the job is the one-rank tiled job bit for bit.
TEST_F(TiledDecode, EachPipelineDecodesItsImagesOverItsOwnRanks) {
  const int images = 4;
  JobResult one = run_fluxmpi(1, args("st1", *dir_ / "model", images, {}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  JobResult r = run_fluxmpi(4, args("st4", *dir_ / "model", images, {"--stages", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_job("st4", "st1", images);
  const std::map<int, int> taken = groups_taken(r.output);
  ASSERT_EQ(taken.size(), 2u) << r.output;
  EXPECT_EQ(taken.at(0) + taken.at(2), images) << r.output;
  // Which leader gets how many groups depends on timing; a leader that took one has its helper.
  std::map<int, int> expected = {{1, 0}};  // rank 0 fills its two slots first
  if (taken.at(2) > 0) expected[3] = 2;
  EXPECT_EQ(leaders_helped(r.output), expected) << r.output;
}

TEST_F(TiledDecode, UntiledDecodeStaysOnTheLeader) {
  auto a = args("untiled", *dir_ / "model", 1, {});
  a.erase(std::find(a.begin(), a.end(), "--vae-tiling"));
  JobResult r = run_fluxmpi(2, a);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(helpers_in(r.output).empty()) << r.output;
}

TEST_F(TiledDecode, DryRunShowsTheSpreadDecode) {
  auto a = args("dry", *dir_ / "model", 1, {"--dry-run"});
  JobResult r = run_fluxmpi(3, a);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("decode: 9 VAE tiles a pass, round robin over ranks 0,1,2"), std::string::npos) << r.output;
  // With --stages the plan is one pipeline's: its ranks 0 and 1 (every pipeline alike).
  JobResult st = run_fluxmpi(4, args("dry-st", *dir_ / "model", 1, {"--dry-run", "--stages", "2"}));
  ASSERT_EQ(st.exit_code, 0) << st.output;
  EXPECT_NE(st.output.find("decode: 9 VAE tiles a pass, round robin over ranks 0,1;"), std::string::npos) << st.output;
}

// FLUX.2's VAE reuses the FLUX.1 decoder's tiling: the klein fixture with 32-pixel tiles.
TEST_F(TiledDecode, Flux2GivesTheOneRankBits) {
  FLUXMPI_REQUIRE_FIXTURES();
  const fs::path source = fs::path(fixture_root()) / "flux2" / "tiny-flux2-klein";
  if (!fs::exists(source)) {
    if (running_in_ci()) FAIL() << "flux2 fixture missing: " << source;
    GTEST_SKIP() << "flux2 fixture missing: " << source;
  }
  const fs::path model = fs::path(dir_->path()) / "klein-tiles";
  fs::create_directories(model / "vae");
  for (const auto& entry : fs::directory_iterator(source))
    if (entry.path().filename() != "vae") fs::create_directory_symlink(entry.path(), model / entry.path().filename());
  for (const auto& entry : fs::directory_iterator(source / "vae"))
    if (entry.path().filename() != "config.json") fs::create_symlink(entry.path(), model / "vae" / entry.path().filename());
  nlohmann::json config;
  std::ifstream(source / "vae" / "config.json") >> config;
  config["sample_size"] = 32;  // 4-cell latent tiles every 3: a 64-px image is 9 tiles
  std::ofstream(model / "vae" / "config.json") << config.dump(1);
  same_on_every_rank_count("f2", model.string(), 2, {"--max-sequence-length", "64"});
}

}  // namespace
}  // namespace fluxmpi::test
