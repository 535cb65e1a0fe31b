// The checkpoint's FLUX.1 Redux additions (docs/hdf5-format.md): the `redux` attribute's round
// trip, the longer text stream, no token ids for the zero text, the images and their embeddings,
// and --resume's comparison naming the Redux field that differs.

#include <gtest/gtest.h>

#include <functional>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/format.h"
#include "core/error.h"
#include "support/tensor_compare.h"
#include "unit/ckpt_test_job.h"

namespace fluxmpi::ckpt {
namespace {
using namespace test;

// tiny_job's image 0 (S = 16, no true CFG) with two Redux images of 9 tokens each; the second
// image made from the zero text.
Job redux_job() {
  Job job = tiny_job();
  job.images[1].negative_prompt = "";
  job.images[1].true_cfg_scale = 1.0;
  for (size_t i = 0; i < job.images.size(); ++i) {
    ImageAttributes::Redux& r = job.images[i].redux;
    r.model = "/models/FLUX.1-Redux-dev";
    r.images = {{"/in/a.png", 30, 20}, {"/in/b.png", 12, 40}};
    r.prompt_scales = {1.0, 0.6};
    r.pooled_scales = {0.8, 0.5};
    r.image_tokens = 9;
    r.zero_text = i == 1;
  }
  return job;
}



TEST(CheckpointRedux, TheTextStreamGrowsByTheImageTokens) {
  const Job job = redux_job();
  const ImageShape s = shape_of(job, 0);
  EXPECT_EQ(s.text_tokens, 16 + 9);
  const auto specs = dataset_specs(s);
  EXPECT_EQ(find(specs, "text/prompt_embeds")->shape, (std::vector<int64_t>{25, 32}));
  EXPECT_EQ(find(specs, "text/t5_input_ids")->shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(find(specs, "text/redux_image_embeds")->shape, (std::vector<int64_t>{2, 9, 32}));
  EXPECT_EQ(find(specs, "inputs/redux_image_0")->shape, (std::vector<int64_t>{30, 20, 3}));
  EXPECT_EQ(find(specs, "inputs/redux_image_1")->shape, (std::vector<int64_t>{12, 40, 3}));
  const auto zero = dataset_specs(shape_of(job, 1));
  EXPECT_EQ(find(zero, "text/t5_input_ids"), nullptr);
  EXPECT_EQ(find(zero, "text/clip_input_ids"), nullptr);
  EXPECT_NE(find(zero, "text/pooled_prompt_embeds"), nullptr);
}

TEST(CheckpointRedux, RefusesInconsistentAttributes) {
  Job job = redux_job();
  job.images[0].redux.pooled_scales.pop_back();
  EXPECT_THROW(shape_of(job, 0), CheckpointError);
  job = redux_job();
  job.images[0].negative_prompt = "blurry";
  job.images[0].true_cfg_scale = 2.0;
  EXPECT_THROW(shape_of(job, 0), CheckpointError);
  job = redux_job();
  job.images[0].redux.images[1].height = 0;
  EXPECT_THROW(shape_of(job, 0), CheckpointError);
}

TEST(CheckpointRedux, AttributesAndDatasetsRoundTrip) {
  TempDir dir;
  const std::string path = dir.path("run.h5");
  const Job job = redux_job();
  const at::Tensor a = (at::arange(30 * 20 * 3, at::kInt) % 251).to(at::kByte).reshape({30, 20, 3});
  const at::Tensor b = (at::arange(12 * 40 * 3, at::kInt) % 13).to(at::kByte).reshape({12, 40, 3});
  const at::Tensor embeds = pattern({2, 9, 32}, 9, 0, 0);
  {
    CheckpointWriter w = CheckpointWriter::create(path, job.file, job.images);
    write_job(w, 1, [&](TextEmbeddings& t) {
      t.redux_image_embeds = embeds;
      t.redux_images = {a, b};
    });
    w.close();
  }
  const CheckpointReader r = CheckpointReader::open(path);
  for (int64_t i = 0; i < 2; ++i) {
    const ImageAttributes::Redux& got = r.attributes(i).redux;
    const ImageAttributes::Redux& want = job.images[static_cast<size_t>(i)].redux;
    EXPECT_EQ(got.model, want.model);
    ASSERT_EQ(got.images.size(), 2u);
    EXPECT_EQ(got.images[1], want.images[1]);
    EXPECT_EQ(got.prompt_scales, want.prompt_scales);
    EXPECT_EQ(got.pooled_scales, want.pooled_scales);
    EXPECT_EQ(got.image_tokens, 9);
    EXPECT_EQ(got.zero_text, i == 1);
    EXPECT_TRUE(fluxmpi::test::identical("inputs/redux_image_0", r.dataset(i, "inputs/redux_image_0"), a));
    EXPECT_TRUE(fluxmpi::test::identical("inputs/redux_image_1", r.dataset(i, "inputs/redux_image_1"), b));
    const TextEmbeddings t = r.text(i);
    EXPECT_TRUE(fluxmpi::test::identical("text/redux_image_embeds", t.redux_image_embeds, embeds));
    EXPECT_EQ(t.prompt_embeds.size(0), 25);
    EXPECT_EQ(t.t5_input_ids.defined(), i == 0);
  }
  // A file without Redux reads back without it.
  EXPECT_FALSE(ImageAttributes().redux.enabled());
}

TEST(CheckpointRedux, ResumeNamesTheFieldThatDiffers) {
  const Job stored = redux_job();
  auto difference = [&](const std::function<void(ImageAttributes&)>& change) {
    Job asked = redux_job();
    change(asked.images[0]);
    try {
      check_matches("run.h5", stored.file, stored.images, asked.file, asked.images);
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("no difference");
  };
  EXPECT_EQ(difference([](ImageAttributes&) {}), "no difference");
  EXPECT_NE(difference([](ImageAttributes& a) { a.redux.prompt_scales[1] = 0.7; })
                .find("'redux prompt scale 1' is 0.6 in the checkpoint, the command line asks for 0.7"),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.redux.images[0].path = "/in/c.png"; }).find("'redux image 0' is \"/in/a.png\""),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.redux.images.pop_back(); }).find("'number of redux images' is 2"),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.redux = {}; }).find("'redux model' is \"/models/FLUX.1-Redux-dev\""),
            std::string::npos);
  EXPECT_NE(difference([](ImageAttributes& a) { a.redux.zero_text = true; }).find("'redux zero text' is false"),
            std::string::npos);
}

TEST(CheckpointRedux, AttributeJsonRoundTripsAndRefusesOtherText) {
  const ImageAttributes::Redux r = redux_job().images[0].redux;
  const auto back = redux_from_json(redux_to_json(r));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->images, r.images);
  EXPECT_EQ(back->pooled_scales, r.pooled_scales);
  EXPECT_FALSE(redux_from_json("[1, 2]").has_value());
  EXPECT_FALSE(redux_from_json("{\"model\": 3}").has_value());
  EXPECT_FALSE(redux_from_json("not json").has_value());
}

}  // namespace
}  // namespace fluxmpi::ckpt
