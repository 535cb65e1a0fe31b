// make-tiny-model's pipelines: the diffusers layout, and a model it writes and reloads computes
// what the modules that wrote it compute (fp32 bit for bit; bf16 weights within bf16 rounding).

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <filesystem>

#include "core/error.h"
#include "io/model_dir.h"
#include "models/clip_text.h"
#include "models/common/init.h"
#include "models/flux/latents.h"
#include "models/flux/transformer.h"
#include "models/t5_encoder.h"
#include "models/vae/vae_decoder.h"
#include "pipeline/tiny_model.h"
#include "support/tensor_compare.h"
#include "text/clip_tokenizer.h"
#include "text/t5_tokenizer.h"

namespace fluxmpi::pipeline {
namespace {
namespace fs = std::filesystem;

class TinyModel : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string((fs::temp_directory_path() / ("fluxmpi-tiny-" + std::to_string(::getpid()))).string());
    fs::remove_all(*root_);
    write_tiny_model(*root_ + "/fp32", tiny_model_preset("tiny"));
    TinyModelSpec bf16 = tiny_model_preset("tiny");
    bf16.dtype = "bf16";
    bf16.variant = "schnell";
    write_tiny_model(*root_ + "/bf16", bf16);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  static std::string* root_;
};
std::string* TinyModel::root_ = nullptr;

TEST_F(TinyModel, WritesTheDiffusersLayout) {
  for (const char* f : {"model_index.json", "scheduler/scheduler_config.json", "transformer/config.json",
                        "transformer/diffusion_pytorch_model.safetensors.index.json", "text_encoder/config.json",
                        "text_encoder/model.safetensors", "text_encoder_2/model.safetensors", "tokenizer/vocab.json",
                        "tokenizer/merges.txt", "tokenizer_2/spiece.model", "vae/config.json",
                        "vae/diffusion_pytorch_model.safetensors"})
    EXPECT_TRUE(fs::exists(*root_ + "/fp32/" + f)) << f;
  io::ModelDir dir(*root_ + "/fp32");
  EXPECT_NO_THROW(dir.check_consistency());
  io::TensorStore store = dir.open_weights("transformer");
  EXPECT_NO_THROW(dir.check_transformer_weights(store));
  EXPECT_EQ(dir.variant(), io::Variant::Dev);
  EXPECT_EQ(io::ModelDir(*root_ + "/bf16").variant(), io::Variant::Schnell);
  EXPECT_THROW(write_tiny_model(*root_ + "/fp32", tiny_model_preset("tiny")), UsageError) << "refuses a non-empty folder";
}

TEST_F(TinyModel, ReloadedModelsComputeWhatTheirWritersComputed) {
  c10::InferenceMode guard;
  const TinyModelSpec spec = tiny_model_preset("tiny");
  for (const char* dtype : {"fp32", "bf16"}) {
    io::ModelDir dir(*root_ + "/" + dtype);
    const bool exact = std::string(dtype) == "fp32";
    // bf16 on disk: the writer's fp32 weights rounded once; compare with the rounded writer.
    auto writer_weights = [&](torch::nn::Module& m, uint64_t seed) {
      nn::fill_random(m, seed);
      if (!exact) nn::cast_parameters(m, at::kBFloat16), nn::cast_parameters(m, at::kFloat);
    };
    const io::TransformerConfig& tc = dir.transformer_config();
    flux::FluxTransformer written(tc, flux::TransformerPart::whole(tc));
    writer_weights(*written, spec.seed + 1);
    flux::FluxTransformer loaded = flux::load_flux_transformer(dir, flux::TransformerPart::whole(tc), at::kFloat, at::kCPU);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
    flux::TransformerInputs in;
    in.latents = at::randn({1, 16, tc.in_channels}, gen);
    in.text = at::randn({1, 9, tc.joint_attention_dim}, gen);
    in.pooled = at::randn({1, tc.pooled_projection_dim}, gen);
    in.timestep = at::full({1}, 0.5f);
    in.guidance = at::full({1}, 3.5f);
    at::Tensor txt_ids = flux::text_position_ids(9), img_ids = flux::image_position_ids(8, 8);
    EXPECT_TRUE(test::close_to(std::string(dtype) + " transformer", loaded->forward(in, txt_ids, img_ids),
                               written->forward(in, txt_ids, img_ids), test::kTolFp32));

    text_models::ClipTextModel clip_w(dir.clip_config());
    writer_weights(*clip_w, spec.seed + 2);
    auto clip_l = text_models::load_clip_text_model(dir, at::kFloat, at::kCPU);
    text::ClipTokenizer tok(dir.component_dir("tokenizer"));
    at::Tensor ids = at::tensor(tok.encode("a small red boat").ids, at::kLong).unsqueeze(0);
    EXPECT_TRUE(test::identical(std::string(dtype) + " CLIP pooled", clip_l->forward(ids).pooler_output,
                                clip_w->forward(ids).pooler_output));

    text_models::T5EncoderModel t5_w(dir.t5_config());
    writer_weights(*t5_w, spec.seed + 3);
    auto t5_l = text_models::load_t5_encoder(dir, at::kFloat, at::kCPU);
    text::T5Tokenizer t5tok(dir.component_dir("tokenizer_2"));
    at::Tensor t5_ids = at::tensor(t5tok.encode("a small red boat", 16).ids, at::kLong).unsqueeze(0);
    EXPECT_TRUE(test::identical(std::string(dtype) + " T5", t5_l->forward(t5_ids).last_hidden_state,
                                t5_w->forward(t5_ids).last_hidden_state));

    vae::VaeDecoder vae_w(dir.vae_config());
    writer_weights(*vae_w, spec.seed + 4);
    auto vae_l = vae::load_vae_decoder(dir, at::kFloat, at::kCPU);
    at::Tensor z = at::randn({1, dir.vae_config().latent_channels, 4, 4}, gen);
    EXPECT_TRUE(test::identical(std::string(dtype) + " VAE", vae_l->forward(z), vae_w->forward(z)));
  }
}

TEST(TinyModelPresets, RopeAxesSumToTheHeadDim) {
  EXPECT_EQ(rope_axes_for(128), (std::vector<int64_t>{16, 56, 56}));
  EXPECT_EQ(rope_axes_for(16), (std::vector<int64_t>{2, 6, 8}));
  for (int64_t d = 6; d <= 256; d += 2) {
    auto a = rope_axes_for(d);
    EXPECT_EQ(a[0] + a[1] + a[2], d) << d;
    for (auto x : a) EXPECT_EQ(x % 2, 0) << d;
  }
  EXPECT_THROW(tiny_model_preset("huge"), UsageError);
}

}  // namespace
}  // namespace fluxmpi::pipeline
