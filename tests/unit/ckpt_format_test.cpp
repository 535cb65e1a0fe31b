// The checkpoint format without files: shapes implied by the attributes, the status names, and
// check_matches, which names the first field in which a checkpoint and a command line differ.

#include <gtest/gtest.h>

#include <functional>

#include "ckpt/format.h"
#include "core/error.h"
#include "unit/ckpt_test_job.h"

namespace fluxmpi::ckpt {
namespace {
using namespace test;

std::string matches_error(const Job& stored, const Job& requested) {
  try {
    check_matches("run.h5", stored.file, stored.images, requested.file, requested.images);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "matches";
}

TEST(CheckpointFormat, ShapesFollowFromTheAttributes) {
  Job job = tiny_job(7);
  io::TransformerConfig config = stored_transformer_config(job.file.model_config, "cfg");
  ImageShape s = image_shape(config, job.file, job.images[1], "run.h5: /images/00001");
  EXPECT_EQ(s.text_tokens, 16);
  EXPECT_EQ(s.joint_attention_dim, 32);
  EXPECT_EQ(s.pooled_projection_dim, 24);
  EXPECT_EQ(s.latent_height, 8);
  EXPECT_EQ(s.latent_width, 4);
  EXPECT_EQ(s.latent_channels, 16);
  EXPECT_EQ(s.image_tokens, 8);
  EXPECT_EQ(s.token_dim, 64);
  EXPECT_EQ(s.steps, 7);
  EXPECT_TRUE(s.true_cfg);
  std::vector<std::string> texts;
  for (const DatasetSpec& d : dataset_specs(s)) texts.push_back(d.name + ": " + spec_text(d));
  EXPECT_EQ(texts, (std::vector<std::string>{
                       "status: string scalar", "last_step: int64 scalar", "text/prompt_embeds: float32 [16, 32]",
                       "text/pooled_prompt_embeds: float32 [24]", "text/clip_input_ids: int32 [77]",
                       "text/t5_input_ids: int32 [16]", "text/negative_prompt_embeds: float32 [16, 32]",
                       "text/negative_pooled_prompt_embeds: float32 [24]", "schedule/timesteps: float32 [7]",
                       "schedule/sigmas: float32 [8]", "latents/initial: float32 [8, 64]",
                       "latents/steps: float32 [n, 8, 64]", "latents/noise_pred: float32 [n, 8, 64]",
                       "latents/step_index: int32 [n]", "image: uint8 [64, 32, 3]"}));
  // FLUX.1 at 1024 x 1024: 4096 image tokens.
  job.images[0].height = job.images[0].width = 1024;
  EXPECT_EQ(image_shape(config, job.file, job.images[0], "x").image_tokens, 4096);
}

TEST(CheckpointFormat, TrueCfgIsTheStoredEffectiveScaleAboveOne) {
  ImageAttributes a;
  a.true_cfg_scale = 4;  // an empty negative prompt is still a negative prompt, as in diffusers
  EXPECT_TRUE(uses_true_cfg(a));
  a.negative_prompt = "blurry";
  EXPECT_TRUE(uses_true_cfg(a));
  a.true_cfg_scale = 1;
  EXPECT_FALSE(uses_true_cfg(a));
}

TEST(CheckpointFormat, RejectsImpossibleImageAttributes) {
  Job job = tiny_job();
  io::TransformerConfig config = stored_transformer_config(job.file.model_config, "cfg");
  job.images[0].width = 40;
  try {
    image_shape(config, job.file, job.images[0], "run.h5: /images/00000");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_STREQ(e.what(),
                 "run.h5: /images/00000: attribute 'width' must be a positive multiple of 16 (2 * vae_scale_factor), got 40");
  }
  job.images[0].width = 32;
  job.images[0].num_inference_steps = 0;
  EXPECT_THROW(image_shape(config, job.file, job.images[0], "x"), CheckpointError);
  job.images[0].num_inference_steps = 4;
  job.file.vae_scale_factor = 6;
  EXPECT_THROW(image_shape(config, job.file, job.images[0], "x"), CheckpointError);
}

TEST(CheckpointFormat, StatusNamesRoundTrip) {
  for (ImageStatus s : {ImageStatus::Encoding, ImageStatus::Denoising, ImageStatus::Decoded})
    EXPECT_EQ(parse_status(status_name(s), "x"), s);
  try {
    parse_status("finished", "run.h5: /images/00000/status");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_STREQ(e.what(), "run.h5: /images/00000/status: status is 'finished', expected encoding, denoising or decoded");
  }
  EXPECT_LT(std::string("denoising").size(), static_cast<size_t>(kStatusBytes));
}

TEST(CheckpointFormat, ImageNamesAreZeroPaddedToFiveDigits) {
  EXPECT_EQ(image_group(0), "/images/00000");
  EXPECT_EQ(image_group(123), "/images/00123");
  EXPECT_EQ(image_object(3, "latents/steps"), "/images/00003/latents/steps");
}

TEST(CheckpointFormat, CheckMatchesAcceptsTheSameJobAndIgnoresPathVersionAndTime) {
  Job a = tiny_job();
  Job b = tiny_job();
  b.file.model = "/elsewhere/tiny-flux";
  b.file.fluxmpi_version = "9.9.9";
  b.file.created = "2030-01-01T00:00:00Z";
  b.file.model_config = R"({"in_channels": 64, "num_layers": 1, "num_single_layers": 2, "attention_head_dim": 16,
    "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 24, "guidance_embeds": true,
    "axes_dims_rope": [4, 6, 6], "_diffusers_version": "0.40.0"})";
  EXPECT_EQ(matches_error(a, b), "matches");
}

// Where the weights came from: a recorded source must be the file the run uses; a source only one
// side records (an older checkpoint, a resumed run that loads no text encoder) is not compared.
TEST(CheckpointFormat, CheckMatchesComparesTheRecordedSourceFiles) {
  Job a = tiny_job();
  a.file.sources = {"/m/flux1-dev.safetensors", "/m/ae.safetensors", "/m/clip_l.safetensors", "/m/t5xxl.safetensors",
                    "/usr/share/fluxmpi/models/FLUX.1-dev"};
  Job b = a;
  EXPECT_EQ(matches_error(a, b), "matches");
  b.file.sources.text_encoder.clear();
  b.file.sources.text_encoder_2.clear();
  EXPECT_EQ(matches_error(a, b), "matches");
  Job old = tiny_job();  // no source_* attributes
  EXPECT_EQ(matches_error(old, a), "matches");
  b = a;
  b.file.sources.vae = "/m/other-ae.safetensors";
  EXPECT_EQ(matches_error(a, b),
            "run.h5: 'source_vae' is \"/m/ae.safetensors\" in the checkpoint, the command line asks for "
            "\"/m/other-ae.safetensors\"; the checkpoint belongs to another job");
  b = a;
  b.file.sources.transformer = "/m/flux1-dev-fp8.safetensors";
  EXPECT_NE(matches_error(a, b).find("'source_transformer' is \"/m/flux1-dev.safetensors\""), std::string::npos);
  // A GGUF transformer: the same path holding another quantization is another job.
  a.file.sources.transformer = b.file.sources.transformer = "/m/flux1-dev.gguf";
  a.file.sources.transformer_quantization = "F32 x 471, Q8_0 x 304, F16 x 5";
  b.file.sources.transformer_quantization = "F32 x 471, Q4_K x 304, F16 x 5";
  EXPECT_EQ(matches_error(a, b),
            "run.h5: 'source_transformer_quantization' is \"F32 x 471, Q8_0 x 304, F16 x 5\" in the checkpoint, the command "
            "line asks for \"F32 x 471, Q4_K x 304, F16 x 5\"; the checkpoint belongs to another job");
  b.file.sources.transformer_quantization = a.file.sources.transformer_quantization;
  EXPECT_EQ(matches_error(a, b), "matches");
}

TEST(CheckpointFormat, CheckMatchesNamesTheFirstDifferingField) {
  struct Change {
    std::function<void(Job&)> apply;
    std::string message;
  };
  const std::string tail = "; the checkpoint belongs to another job";
  const std::vector<Change> changes = {
      {[](Job& j) { j.file.format_version = 2; },  // a stored file of another format version
       "run.h5: 'format_version' is 2 in the checkpoint, the command line asks for 1"},
      {[](Job& j) { j.file.model_config = R"({"num_layers": 19})"; },
       "run.h5: model_config: 'num_layers' is 1 in the checkpoint, the command line asks for 19"},
      {[](Job& j) { j.images.pop_back(); },
       "run.h5: 'number of images' is 2 in the checkpoint, the command line asks for 1"},
      {[](Job& j) { j.file.vae_scale_factor = 16; },
       "run.h5: 'vae_scale_factor' is 8 in the checkpoint, the command line asks for 16"},
      {[](Job& j) { j.images[0].prompt = "a dog"; },
       "run.h5: /images/00000: 'prompt' is \"a photo of a cat\" in the checkpoint, the command line asks for \"a dog\""},
      {[](Job& j) { j.images[1].prompt_2 = ""; },
       "run.h5: /images/00001: 'prompt_2' is \"dog, snow\" in the checkpoint, the command line asks for \"\""},
      {[](Job& j) { j.images[1].negative_prompt = "ugly"; },
       "run.h5: /images/00001: 'negative_prompt' is \"blurry\" in the checkpoint, the command line asks for \"ugly\""},
      {[](Job& j) { j.images[1].seed = 1; },
       "run.h5: /images/00001: 'seed' is 43 in the checkpoint, the command line asks for 1"},
      {[](Job& j) { j.images[0].height = 128; },
       "run.h5: /images/00000: 'height' is 64 in the checkpoint, the command line asks for 128"},
      {[](Job& j) { j.images[0].width = 64; },
       "run.h5: /images/00000: 'width' is 32 in the checkpoint, the command line asks for 64"},
      {[](Job& j) { j.images[0].num_inference_steps = 28; },
       "run.h5: /images/00000: 'num_inference_steps' is 4 in the checkpoint, the command line asks for 28"},
      {[](Job& j) { j.images[0].guidance_scale = 3.5000000000000004; },
       "run.h5: /images/00000: 'guidance_scale' is 3.5 in the checkpoint, the command line asks for 3.5000000000000004"},
      {[](Job& j) { j.images[1].true_cfg_scale = 1.5; },
       "run.h5: /images/00001: 'true_cfg_scale' is 2 in the checkpoint, the command line asks for 1.5"},
      {[](Job& j) { j.images[0].max_sequence_length = 512; },
       "run.h5: /images/00000: 'max_sequence_length' is 16 in the checkpoint, the command line asks for 512"},
      {[](Job& j) { j.images[0].dtype = "bf16"; },
       "run.h5: /images/00000: 'dtype' is \"fp32\" in the checkpoint, the command line asks for \"bf16\""},
      {[](Job& j) { j.images[1].vae_tiling = 1; },  // tiled decoding changes the pixels
       "run.h5: /images/00001: 'vae_tiling' is 0 in the checkpoint, the command line asks for 1"},
  };
  for (const Change& c : changes) {
    Job stored = tiny_job();
    Job requested = tiny_job();
    // format_version is a property of the stored file; everything else is changed in the request.
    c.apply(c.message.find("format_version") != std::string::npos ? stored : requested);
    EXPECT_EQ(matches_error(stored, requested), c.message + tail);
  }
  // The first difference wins: prompt of image 0 before the seed of image 1.
  Job stored = tiny_job();
  Job requested = tiny_job();
  requested.images[1].seed = 9;
  requested.images[0].prompt = "x";
  EXPECT_EQ(matches_error(stored, requested),
            "run.h5: /images/00000: 'prompt' is \"a photo of a cat\" in the checkpoint, the command line asks for \"x\"" +
                tail);
}

}  // namespace
}  // namespace fluxmpi::ckpt
