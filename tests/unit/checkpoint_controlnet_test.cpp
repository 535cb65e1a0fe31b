// The checkpoint's ControlNet additions (docs/hdf5-format.md): the attribute `controlnets` (one
// entry per run), inputs/controlnet_image_<k> per control image and latents/controlnet for the
// runs that read latents, their round trip, and --resume naming the run and field that differ.

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

// tiny_job (64 x 32, L_img 8) with two ControlNet runs: a Union net on a 40 x 30 image (mode 2, a
// guidance window) and an XLabs net on a 64 x 32 one (its pixels, no latents).
Job controlnet_job() {
  Job job = tiny_job();
  for (ImageAttributes& a : job.images) {
    a.pipeline = "controlnet";
    a.controlnets = {ControlNetUse{"/nets/union", "/in/edges.png", 40, 30, 2, 0.8, 0.1, 0.9, false},
                     ControlNetUse{"/nets/xlabs", "/in/depth.png", 64, 32, -1, 1.0, 0.0, 1.0, true}};
  }
  return job;
}



TEST(CheckpointControlNet, DatasetsOfTheRuns) {
  const auto specs = dataset_specs(shape_of(controlnet_job(), 0));
  ASSERT_NE(find(specs, "inputs/controlnet_image_0"), nullptr);
  EXPECT_EQ(find(specs, "inputs/controlnet_image_0")->shape, (std::vector<int64_t>{40, 30, 3}));
  EXPECT_EQ(find(specs, "inputs/controlnet_image_1")->shape, (std::vector<int64_t>{64, 32, 3}));
  EXPECT_EQ(find(specs, "latents/controlnet")->shape, (std::vector<int64_t>{1, 8, 64}));  // the Union run only
  EXPECT_EQ(find(specs, "latents/image"), nullptr);
  Job bad = controlnet_job();
  bad.images[0].controlnets.clear();
  EXPECT_THROW(shape_of(bad, 0), CheckpointError);  // pipeline controlnet without runs
}

TEST(CheckpointControlNet, AttributesAndDatasetsRoundTrip) {
  TempDir dir;
  const std::string path = dir.path("run.h5");
  const Job job = controlnet_job();
  const ImageShape s = shape_of(job, 0);
  const at::Tensor pixels = (at::arange(40 * 30 * 3, at::kInt) % 251).to(at::kByte).reshape({40, 30, 3});
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    write_prologue(w, 0);
    w.write_condition(0, "inputs/controlnet_image_0", pixels);
    w.write_condition(0, "latents/controlnet", step_latents(s, 0, 9).unsqueeze(0));
    w.close();
  }
  CheckpointReader r = CheckpointReader::open(path);
  const ImageAttributes& a = r.attributes(0);
  EXPECT_EQ(a.pipeline, "controlnet");
  ASSERT_EQ(a.controlnets.size(), 2u);
  EXPECT_TRUE(a.controlnets[0] == job.images[0].controlnets[0]);
  EXPECT_TRUE(a.controlnets[1] == job.images[0].controlnets[1]);
  EXPECT_TRUE(fluxmpi::test::identical("inputs/controlnet_image_0", r.dataset(0, "inputs/controlnet_image_0"), pixels));
  EXPECT_TRUE(fluxmpi::test::identical("latents/controlnet", r.dataset(0, "latents/controlnet"),
                                       step_latents(s, 0, 9).unsqueeze(0)));
}

TEST(CheckpointControlNet, ResumeNamesTheRunAndField) {
  const Job stored = controlnet_job();
  auto difference = [&](const std::function<void(ImageAttributes&)>& change) {
    Job asked = controlnet_job();
    change(asked.images[0]);
    try {
      check_matches("run.h5", stored.file, stored.images, asked.file, asked.images);
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("no difference");
  };
  EXPECT_EQ(difference([](ImageAttributes&) {}), "no difference");
  EXPECT_NE(difference([](ImageAttributes& a) { a.controlnets[1].scale = 0.5; })
                .find("'controlnets[1].scale' is 1 in the checkpoint, the command line asks for 0.5"),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.controlnets[0].controlnet = "/nets/other"; })
                .find("'controlnets[0].controlnet' is \"/nets/union\""),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.controlnets[0].mode = 3; }).find("'controlnets[0].mode' is 2"),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.controlnets.pop_back(); }).find("'number of controlnets' is 2"),
            std::string::npos);
}

TEST(CheckpointControlNet, JsonRefusesWhatItCannotRead) {
  EXPECT_FALSE(controlnets_from_json("{}"));
  EXPECT_FALSE(controlnets_from_json(R"([{"controlnet": "/a"}])"));
  const auto back = controlnets_from_json(controlnets_to_json(controlnet_job().images[0].controlnets));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->size(), 2u);
}

}  // namespace
}  // namespace fluxmpi::ckpt
