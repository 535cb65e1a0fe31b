// The mode a job runs (pipeline/image_mode.h): from model_index.json's class, the transformer's
// channels and --pipeline, against the inputs given; the strength's schedule cut.

#include <gtest/gtest.h>

#include "core/error.h"
#include "pipeline/image_mode.h"

namespace fluxmpi::pipeline {
namespace {

ModeRequest request(const std::string& cls, int64_t in, bool image, bool mask, bool control, std::string option = "") {
  ModeRequest r;
  r.pipeline_class = cls;
  r.in_channels = in;
  r.out_channels = 64;
  r.pipeline_option = std::move(option);
  r.image = image;
  r.mask = mask;
  r.control_image = control;
  return r;
}

void expect_refused(const ModeRequest& r, const std::string& part) {
  try {
    resolve_mode(r);
    ADD_FAILURE() << "accepted; expected an error containing '" << part << "'";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ImageMode, PlainFluxModelRunsText2ImgImg2ImgOrInpaint) {
  EXPECT_EQ(resolve_mode(request("FluxPipeline", 64, false, false, false)).mode, PipelineMode::Text2Img);
  EXPECT_EQ(resolve_mode(request("FluxPipeline", 64, true, false, false)).mode, PipelineMode::Img2Img);
  EXPECT_EQ(resolve_mode(request("FluxPipeline", 64, true, true, false)).mode, PipelineMode::Inpaint);
  EXPECT_EQ(resolve_mode(request("FluxImg2ImgPipeline", 64, true, false, false)).mode, PipelineMode::Img2Img);
  EXPECT_EQ(resolve_mode(request("FluxInpaintPipeline", 64, true, true, false)).mode, PipelineMode::Inpaint);
}

TEST(ImageMode, KindFromClassThenChannelsThenOption) {
  EXPECT_EQ(resolve_mode(request("FluxFillPipeline", 384, true, true, false)).mode, PipelineMode::Fill);
  EXPECT_EQ(resolve_mode(request("FluxPipeline", 384, true, true, false)).mode, PipelineMode::Fill);  // a single file
  EXPECT_EQ(resolve_mode(request("FluxControlPipeline", 128, false, false, true)).mode, PipelineMode::Control);
  EXPECT_EQ(resolve_mode(request("FluxPipeline", 128, false, false, true)).mode, PipelineMode::Control);
  EXPECT_EQ(resolve_mode(request("FluxKontextPipeline", 64, true, false, false)).mode, PipelineMode::Kontext);
  EXPECT_EQ(resolve_mode(request("FluxKontextPipeline", 64, false, false, false)).mode, PipelineMode::Kontext);
  EXPECT_EQ(resolve_mode(request("FluxPipeline", 64, true, false, false, "kontext")).mode, PipelineMode::Kontext);
  EXPECT_EQ(resolve_mode(request("FluxPipeline", 64, true, false, false, "FluxKontextPipeline")).kind, ModelKind::Kontext);
  EXPECT_EQ(resolve_mode(request("FluxFillPipeline", 384, true, true, false, "fill")).mode, PipelineMode::Fill);
}

TEST(ImageMode, ContradictionsNameBothSides) {
  expect_refused(request("FluxFillPipeline", 64, true, true, false), "model_index.json says FluxFillPipeline");
  expect_refused(request("FluxFillPipeline", 64, true, true, false), "in_channels is 64");
  expect_refused(request("FluxKontextPipeline", 384, true, false, false), "in_channels is 384");
  expect_refused(request("FluxInpaintPipeline", 384, true, true, false), "FluxInpaintPipeline");
  expect_refused(request("FluxPipeline", 384, true, true, false, "kontext"), "--pipeline kontext needs a FLUX.1 Kontext model");
  expect_refused(request("FluxPipeline", 64, true, true, false, "fill"), "--pipeline fill needs a FLUX.1 Fill model");
  expect_refused(request("FluxKontextPipeline", 64, true, false, false, "img2img"), "model_index.json says FluxKontextPipeline");
  expect_refused(request("FluxPipeline", 64, true, false, false, "flux3"), "--pipeline 'flux3'");
}

TEST(ImageMode, InputsTheModeCannotTake) {
  expect_refused(request("FluxPipeline", 64, false, true, false), "--mask needs --image");
  expect_refused(request("FluxPipeline", 64, false, false, true), "--control-image needs a FLUX.1 Control model");
  expect_refused(request("FluxFillPipeline", 384, true, false, false), "needs --mask");
  expect_refused(request("FluxFillPipeline", 384, true, true, true), "--control-image");
  expect_refused(request("FluxControlPipeline", 128, true, false, true), "takes --control-image FILE");
  expect_refused(request("FluxControlPipeline", 128, false, false, false), "needs --control-image");
  expect_refused(request("FluxKontextPipeline", 64, true, true, false), "--mask");
  expect_refused(request("FluxImg2ImgPipeline", 64, false, false, false), "FluxImg2ImgPipeline model folder needs --image");
  expect_refused(request("FluxPipeline", 64, true, false, false, "inpaint"), "--pipeline inpaint needs --mask");
}

TEST(ImageMode, StrengthCutsTheScheduleAsDiffusersDoes) {
  // int(N - min(N * strength, N)) in float64: a truncation (README of the fixtures).
  EXPECT_EQ(strength_start_step(4, 0.6), 1);
  EXPECT_EQ(strength_start_step(4, 0.3), 2);
  EXPECT_EQ(strength_start_step(7, 0.85), 1);
  EXPECT_EQ(strength_start_step(6, 0.85), 0);
  EXPECT_EQ(strength_start_step(3, 1.0), 0);
  EXPECT_EQ(strength_start_step(25, 0.56), 10);  // 25 * 0.56 = 14.000000000000002 in float64
  EXPECT_EQ(strength_start_step(4, 0.01), 3);    // at least one step runs
  sched::Schedule full;
  full.timesteps = {1000, 750, 500, 250};
  full.sigmas = {1, 0.75, 0.5, 0.25, 0};
  const sched::Schedule cut = cut_schedule(full, 1);
  EXPECT_EQ(cut.timesteps, (std::vector<float>{750, 500, 250}));
  EXPECT_EQ(cut.sigmas, (std::vector<float>{0.75, 0.5, 0.25, 0}));
}

TEST(ImageMode, NamesRoundTrip) {
  for (PipelineMode m : {PipelineMode::Text2Img, PipelineMode::Img2Img, PipelineMode::Inpaint, PipelineMode::Fill,
                         PipelineMode::Control, PipelineMode::Kontext})
    EXPECT_EQ(parse_mode_name(mode_name(m)), m);
  EXPECT_FALSE(parse_mode_name("sdxl").has_value());
}

}  // namespace
}  // namespace fluxmpi::pipeline
