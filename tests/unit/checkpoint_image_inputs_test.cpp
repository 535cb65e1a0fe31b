// The checkpoint's image-input additions (docs/hdf5-format.md): the datasets each mode adds and
// their shapes, the cut schedule's row count, the attributes round trip, write_condition, and
// --resume's comparison naming the mode, the strength and the input files.

#include <gtest/gtest.h>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/format.h"
#include "core/error.h"
#include "support/tensor_compare.h"
#include "unit/ckpt_test_job.h"

namespace fluxmpi::ckpt {
namespace {
using namespace test;

// Image 0 of tiny_job (64 x 32, L_img 8) as an inpaint job of 4 steps cut at 1.
Job inpaint_job() {
  Job job = tiny_job();
  for (ImageAttributes& a : job.images) {
    a.pipeline = "inpaint";
    a.strength = 0.7;
    a.t_start = 1;
    a.image = {"/in/photo.png", 40, 30};
    a.mask = {"/in/mask.png", 40, 30};
  }
  return job;
}

TEST(CheckpointImageInputs, EachModeAddsItsDatasets) {
  Job job = inpaint_job();
  const ImageShape s = shape_of(job, 0);
  EXPECT_EQ(s.steps, 3);  // the schedule and the rows hold N - t_start steps
  const auto specs = dataset_specs(s);
  ASSERT_NE(find(specs, "inputs/image"), nullptr);
  EXPECT_EQ(find(specs, "inputs/image")->shape, (std::vector<int64_t>{40, 30, 3}));
  EXPECT_EQ(find(specs, "inputs/mask")->shape, (std::vector<int64_t>{40, 30}));
  EXPECT_EQ(find(specs, "latents/image")->shape, (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(find(specs, "latents/noise")->shape, (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(find(specs, "latents/mask")->shape, (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(find(specs, "schedule/sigmas")->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(find(specs, "inputs/control_image"), nullptr);

  job.images[0].pipeline = "fill";
  EXPECT_EQ(find(dataset_specs(shape_of(job, 0)), "latents/image")->shape, (std::vector<int64_t>{8, 320}));
  EXPECT_EQ(find(dataset_specs(shape_of(job, 0)), "latents/noise"), nullptr);
  job.images[0].pipeline = "kontext";
  job.images[0].t_start = 0;
  job.images[0].mask = {};
  job.images[0].condition_height = 48, job.images[0].condition_width = 64;
  EXPECT_EQ(find(dataset_specs(shape_of(job, 0)), "latents/image")->shape, (std::vector<int64_t>{12, 64}));
  job.images[0].pipeline = "text2img";
  job.images[0].image = {};
  job.images[0].condition_height = 0;
  EXPECT_EQ(dataset_specs(shape_of(job, 0)).size(), dataset_specs(shape_of(tiny_job(), 0)).size());
}

TEST(CheckpointImageInputs, RefusesABadModeOrCut) {
  Job job = inpaint_job();
  job.images[0].t_start = 4;
  EXPECT_THROW(shape_of(job, 0), CheckpointError);
  job.images[0].t_start = 0;
  job.images[0].pipeline = "outpaint";
  try {
    shape_of(job, 0);
    ADD_FAILURE() << "accepted pipeline 'outpaint'";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("attribute 'pipeline' is 'outpaint'"), std::string::npos) << e.what();
  }
}

TEST(CheckpointImageInputs, AttributesAndConditionRoundTrip) {
  TempDir dir;
  const std::string path = dir.path("run.h5");
  Job job = inpaint_job();
  const ImageShape s = shape_of(job, 0);
  const at::Tensor pixels = (at::arange(40 * 30 * 3, at::kInt) % 251).to(at::kByte).reshape({40, 30, 3});
  const at::Tensor mask = (at::arange(40 * 30, at::kInt) % 2 * 255).to(at::kByte).reshape({40, 30});
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    write_prologue(w, 0);
    w.write_condition(0, "inputs/image", pixels);
    w.write_condition(0, "inputs/mask", mask);
    w.write_condition(0, "latents/image", step_latents(s, 0, 7).unsqueeze(0));
    w.write_condition(0, "latents/noise", step_noise(s, 0, 7));
    w.write_condition(0, "latents/mask", step_latents(s, 0, 8));
    w.close();
  }
  CheckpointReader r = CheckpointReader::open(path);
  const ImageAttributes& a = r.attributes(0);
  EXPECT_EQ(a.pipeline, "inpaint");
  EXPECT_EQ(a.family, "flux1");
  EXPECT_EQ(a.strength, 0.7);
  EXPECT_EQ(a.t_start, 1);
  EXPECT_EQ(a.image, job.images[0].image);
  EXPECT_EQ(a.mask, job.images[0].mask);
  EXPECT_TRUE(a.control_image.path.empty());
  EXPECT_TRUE(fluxmpi::test::identical("inputs/image", r.dataset(0, "inputs/image"), pixels));
  EXPECT_TRUE(fluxmpi::test::identical("inputs/mask", r.dataset(0, "inputs/mask"), mask));
  EXPECT_TRUE(fluxmpi::test::identical("latents/image", r.dataset(0, "latents/image"), step_latents(s, 0, 7)));
  EXPECT_TRUE(fluxmpi::test::identical("latents/noise", r.dataset(0, "latents/noise"), step_noise(s, 0, 7)));
}

TEST(CheckpointImageInputs, ResumeNamesTheFieldThatDiffers) {
  const Job stored = inpaint_job();
  auto difference = [&](const std::function<void(ImageAttributes&)>& change) {
    return resume_difference(stored, inpaint_job(), change);
  };
  EXPECT_NE(difference([](ImageAttributes& a) { a.pipeline = "img2img"; }).find("'pipeline' is \"inpaint\""), std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.strength = 0.6; }).find("'strength' is 0.7 in the checkpoint, the command line asks for 0.6"),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.image.path = "/in/other.png"; }).find("'input_image' is \"/in/photo.png\""),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.mask.height = 41; }).find("'input_mask size' is [40, 30]"), std::string::npos);
  EXPECT_EQ(difference([](ImageAttributes&) {}), "no difference");
}

}  // namespace
}  // namespace fluxmpi::ckpt
