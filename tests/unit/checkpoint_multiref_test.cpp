// The checkpoint's FLUX.2 multi-reference additions (docs/hdf5-format.md): pipeline `multiref`, the
// references' attributes (files, decoded and encoded sizes), inputs/image_<k>, latents/image with
// every reference's tokens and latents/image_ids; the attributes and datasets round trip (int32 ids
// included); a multiref image without references, references without multiref and multiref on
// FLUX.1 are refused; --resume's comparison names the reference that differs.

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

// Flux2Transformer2DModel (in_channels 128: D = 128).
const char* kFlux2Config = R"({
  "_class_name": "Flux2Transformer2DModel", "in_channels": 128, "num_layers": 2, "num_single_layers": 3,
  "attention_head_dim": 24, "num_attention_heads": 2, "joint_attention_dim": 96, "axes_dims_rope": [4, 6, 6, 8],
  "guidance_embeds": false, "mlp_ratio": 3.0, "patch_size": 1, "rope_theta": 2000, "timestep_guidance_channels": 256,
  "eps": 1e-6
})";

// tiny_job as FLUX.2 images with two references: 80x64 (encoded 80x64: 5x4 tokens) and 72x100
// (encoded 64x96: 4x6 tokens), R = 44.
Job multiref_job() {
  Job job = tiny_job();
  job.file.model_config = kFlux2Config;
  for (ImageAttributes& a : job.images) {
    a.family = "flux2";
    a.pipeline = "multiref";
    a.true_cfg_scale = 1.0;
    a.negative_prompt = "";
    a.references = {{{"/in/a.png", 64, 80}, 64, 80}, {{"/in/b.png", 100, 72}, 96, 64}};
  }
  return job;
}

std::string refusal(const Job& job) {
  try {
    shape_of(job, 0);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(CheckpointMultiref, ReferencesAddTheirDatasets) {
  const Job job = multiref_job();
  const ImageShape s = shape_of(job, 0);
  EXPECT_EQ(s.condition_tokens, 20 + 24);
  const auto specs = dataset_specs(s);
  ASSERT_NE(find(specs, "inputs/image_0"), nullptr);
  EXPECT_EQ(find(specs, "inputs/image_0")->shape, (std::vector<int64_t>{64, 80, 3}));
  EXPECT_EQ(find(specs, "inputs/image_1")->shape, (std::vector<int64_t>{100, 72, 3}));
  EXPECT_EQ(find(specs, "inputs/image"), nullptr);
  EXPECT_EQ(find(specs, "latents/image")->shape, (std::vector<int64_t>{44, 128}));
  EXPECT_EQ(find(specs, "latents/image_ids")->shape, (std::vector<int64_t>{44, 4}));
  EXPECT_EQ(find(specs, "latents/image_ids")->type, StoredType::Int32);
}

TEST(CheckpointMultiref, RefusesReferencesThatDoNotFitThePipeline) {
  Job job = multiref_job();
  job.images[0].references.clear();
  EXPECT_NE(refusal(job).find("'reference_images' is 0 but 'pipeline' is 'multiref'"), std::string::npos) << refusal(job);
  job = multiref_job();
  job.images[0].pipeline = "text2img";
  EXPECT_NE(refusal(job).find("'reference_images' is 2 but 'pipeline' is 'text2img'"), std::string::npos) << refusal(job);
  job = multiref_job();
  job.images[0].references[1].height = 90;  // not a multiple of 16
  EXPECT_NE(refusal(job).find("reference image 1 is encoded at 64x90"), std::string::npos) << refusal(job);
  job = multiref_job();
  job.images[0].family = "flux1";
  EXPECT_NE(refusal(job).find("'pipeline' is 'multiref': only FLUX.2 images take reference images"), std::string::npos)
      << refusal(job);
}

TEST(CheckpointMultiref, AttributesAndDatasetsRoundTrip) {
  TempDir dir;
  const std::string path = dir.path("run.h5");
  const Job job = multiref_job();
  const at::Tensor a_pixels = (at::arange(64 * 80 * 3, at::kInt) % 253).to(at::kByte).reshape({64, 80, 3});
  const at::Tensor b_pixels = (at::arange(100 * 72 * 3, at::kInt) % 241).to(at::kByte).reshape({100, 72, 3});
  const at::Tensor tokens = pattern({44, 128}, 9, 0, 0);
  const at::Tensor ids = at::arange(44 * 4, at::kLong).reshape({44, 4});
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    w.write_condition(0, "inputs/image_0", a_pixels);
    w.write_condition(0, "inputs/image_1", b_pixels);
    w.write_condition(0, "latents/image", tokens.unsqueeze(0));
    w.write_condition(0, "latents/image_ids", ids);
    w.close();
  }
  CheckpointReader r = CheckpointReader::open(path);
  const ImageAttributes& a = r.attributes(0);
  EXPECT_EQ(a.pipeline, "multiref");
  ASSERT_EQ(a.references.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(a.references[k].input, job.images[0].references[k].input) << k;
    EXPECT_EQ(a.references[k].height, job.images[0].references[k].height) << k;
    EXPECT_EQ(a.references[k].width, job.images[0].references[k].width) << k;
  }
  EXPECT_TRUE(fluxmpi::test::identical("inputs/image_0", r.dataset(0, "inputs/image_0"), a_pixels));
  EXPECT_TRUE(fluxmpi::test::identical("inputs/image_1", r.dataset(0, "inputs/image_1"), b_pixels));
  EXPECT_TRUE(fluxmpi::test::identical("latents/image", r.dataset(0, "latents/image"), tokens));
  EXPECT_TRUE(fluxmpi::test::identical("latents/image_ids", r.dataset(0, "latents/image_ids").to(at::kLong), ids));
}

TEST(CheckpointMultiref, ResumeNamesTheReferenceThatDiffers) {
  const Job stored = multiref_job();
  auto difference = [&](const std::function<void(ImageAttributes&)>& change) {
    return resume_difference(stored, multiref_job(), change);
  };
  EXPECT_NE(difference([](ImageAttributes& a) { a.references.pop_back(); })
                .find("'reference_images' is 2 in the checkpoint, the command line asks for 1"),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.references[1].input.path = "/in/c.png"; })
                .find("'input_image_1' is \"/in/b.png\" in the checkpoint"),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.references[0].input.width = 81; }).find("'input_image_0 size' is [64, 80]"),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.references[1].width = 48; }).find("'reference size 1' is [96, 64]"),
            std::string::npos);
  EXPECT_EQ(difference([](ImageAttributes&) {}), "no difference");
}

}  // namespace
}  // namespace fluxmpi::ckpt
