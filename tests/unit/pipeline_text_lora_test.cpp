// Text-encoder LoRAs on the tiny encoders of ../shared/fixtures/tiny-flux-dev: a diffusers-layout
// LoRA (text_encoder.* with alpha, text_encoder_2.* without) stacked with a kohya one (lora_te1_*
// in bf16, lora_te2_* in fp16, one module shared with the first LoRA) through
// pipeline::TextEncoders, as rank 0 runs stage 1. Every merged weight equals the merge computed by
// hand in float64 (W + sum of scale * alpha / r * up @ down, kTolFp32 = 1e-5 relative); weights no
// LoRA names are bit-identical to the base model's; the pooled CLIP output and the T5 states equal
// those of base encoders whose weights were set to the hand-computed merge. In an fp16 load, T5's
// fp32 `wo` keeps its merge (fp16 tolerance 1e-3 for the rounded weights).

#include <gtest/gtest.h>
#include <unistd.h>

#include <c10/core/InferenceMode.h>

#include <filesystem>

#include "io/lora_file.h"
#include "io/model_dir.h"
#include "io/safetensors_writer.h"
#include "models/clip_text.h"
#include "models/common/lora.h"
#include "models/t5_encoder.h"
#include "pipeline/text_stage.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::pipeline {
namespace {
namespace fs = std::filesystem;

void add(io::SafetensorsWriter& w, const std::string& key, const at::Tensor& value, io::DType dtype) {
  at::ScalarType st = dtype == io::DType::BF16 ? at::kBFloat16 : dtype == io::DType::F16 ? at::kHalf : at::kFloat;
  at::Tensor t = value.to(st).contiguous();
  w.add(key, dtype, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr(),
        static_cast<size_t>(t.numel() * t.element_size()));
}

// One pair as the test writes it and as the hand merge reads it back (values after the stored
// dtype's rounding).
struct HandPair {
  std::string weight_key;  // the model's parameter
  at::Tensor down, up;     // float64
  double factor;           // scale * alpha / r
};

TEST(TextEncoderLora, MergesMatchAHandComputedMergeOnTheTinyEncoders) {
  FLUXMPI_REQUIRE_FIXTURES();
  const std::string model_dir = test::fixture_root() + "/tiny-flux-dev";
  FLUXMPI_REQUIRE_ASSET(model_dir + "/text_encoder/model.safetensors", "tiny CLIP text encoder");
  c10::InferenceMode guard;
  at::manual_seed(11);
  const fs::path tmp = fs::temp_directory_path() / ("fluxmpi-te-lora-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  io::ModelDir dir(model_dir);
  const int64_t Dc = dir.clip_config().hidden_size, Dt = dir.t5_config().d_model;

  std::vector<HandPair> hand;
  // Writes one pair in `dtype`; records what the hand merge uses (the stored values).
  auto pair = [&](io::SafetensorsWriter& w, const std::string& down_key, const std::string& up_key,
                  const std::string& weight_key, int64_t out, int64_t in, int64_t r, io::DType dtype, double factor) {
    const at::Tensor down = at::randn({r, in}) * 0.3, up = at::randn({out, r}) * 0.3;
    add(w, down_key, down, dtype);
    add(w, up_key, up, dtype);
    at::ScalarType st = dtype == io::DType::BF16 ? at::kBFloat16 : dtype == io::DType::F16 ? at::kHalf : at::kFloat;
    hand.push_back({weight_key, down.to(st).to(at::kDouble), up.to(st).to(at::kDouble), factor});
  };

  // LoRA 1, diffusers layout, scale 0.6.
  io::SafetensorsWriter d;
  const std::string q = "text_model.encoder.layers.0.self_attn.q_proj";
  pair(d, "text_encoder." + q + ".lora_A.weight", "text_encoder." + q + ".lora_B.weight", q + ".weight", Dc, Dc, 4,
       io::DType::F32, 0.6 * 2.0 / 4);
  add(d, "text_encoder." + q + ".alpha", at::full({}, 2.0), io::DType::F32);
  const std::string t5q = "encoder.block.0.layer.0.SelfAttention.q";
  pair(d, "text_encoder_2." + t5q + ".lora_A.weight", "text_encoder_2." + t5q + ".lora_B.weight", t5q + ".weight", Dt,
       Dt, 3, io::DType::F32, 0.6 * 3.0 / 3);
  const std::string diffusers_path = (tmp / "te-diffusers.safetensors").string();
  d.write(diffusers_path);

  // LoRA 2, kohya layout, scale 1.25: CLIP q_proj again (stacked), CLIP fc1 in bf16, T5 wo in fp16.
  io::SafetensorsWriter k;
  pair(k, "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight",
       "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight", q + ".weight", Dc, Dc, 2, io::DType::F32,
       1.25 * 1.0 / 2);
  add(k, "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.alpha", at::full({}, 1.0), io::DType::F32);
  const std::string fc1 = "text_model.encoder.layers.1.mlp.fc1";
  const int64_t Ic = dir.clip_config().intermediate_size;
  pair(k, "lora_te1_text_model_encoder_layers_1_mlp_fc1.lora_down.weight",
       "lora_te1_text_model_encoder_layers_1_mlp_fc1.lora_up.weight", fc1 + ".weight", Ic, Dc, 4, io::DType::BF16,
       1.25 * 8.0 / 4);
  add(k, "lora_te1_text_model_encoder_layers_1_mlp_fc1.alpha", at::full({}, 8.0), io::DType::BF16);
  const std::string wo = "encoder.block.1.layer.1.DenseReluDense.wo";
  const int64_t Ft = dir.t5_config().d_ff;
  pair(k, "lora_te2_encoder_block_1_layer_1_DenseReluDense_wo.lora_down.weight",
       "lora_te2_encoder_block_1_layer_1_DenseReluDense_wo.lora_up.weight", wo + ".weight", Dt, Ft, 4, io::DType::F16,
       1.25 * 4.0 / 4);
  const std::string kohya_path = (tmp / "te-kohya.safetensors").string();
  k.write(kohya_path);

  std::vector<std::shared_ptr<const io::LoraFile>> loras = {
      std::make_shared<const io::LoraFile>(io::LoraSpec{diffusers_path, 0.6}),
      std::make_shared<const io::LoraFile>(io::LoraSpec{kohya_path, 1.25})};

  // The base encoders, with their weights then set to the hand-computed merge.
  auto clip = text_models::load_clip_text_model(dir, at::kFloat, at::kCPU);
  auto t5 = text_models::load_t5_encoder(dir, at::kFloat, at::kCPU);
  std::map<std::string, at::Tensor> base;
  for (auto* m : {static_cast<torch::nn::Module*>(clip.get()), static_cast<torch::nn::Module*>(t5.get())})
    for (const auto& p : m->named_parameters(true)) base[p.key()] = p.value().clone();
  std::map<std::string, at::Tensor> want;
  for (const HandPair& h : hand) {
    if (!want.count(h.weight_key)) want[h.weight_key] = base.at(h.weight_key).to(at::kDouble);
    want[h.weight_key] = want[h.weight_key] + h.up.mm(h.down) * h.factor;
  }
  for (auto* m : {static_cast<torch::nn::Module*>(clip.get()), static_cast<torch::nn::Module*>(t5.get())})
    for (auto& p : m->named_parameters(true))
      if (want.count(p.key())) p.value().set_data(want[p.key()].to(at::kFloat));

  // What stage 1 loads with the two LoRAs.
  const nn::WeightShapes clip_shapes = nn::linear_weight_shapes(dir.open_weights("text_encoder"));
  const nn::WeightShapes t5_shapes = nn::linear_weight_shapes(dir.open_weights("text_encoder_2"));
  auto clip_lora = text_models::load_clip_text_model(
      dir.clip_config(), dir.open_weights("text_encoder"), at::kFloat, at::kCPU,
      nn::LoraSet(loras, io::LoraTarget::Clip, clip_shapes, nn::underscored_names(clip_shapes)).adjust());
  auto t5_lora = text_models::load_t5_encoder(
      dir.t5_config(), dir.open_weights("text_encoder_2"), at::kFloat, at::kCPU,
      nn::LoraSet(loras, io::LoraTarget::T5, t5_shapes, nn::underscored_names(t5_shapes)).adjust());
  int merged = 0;
  for (auto* m : {static_cast<torch::nn::Module*>(clip_lora.get()), static_cast<torch::nn::Module*>(t5_lora.get())}) {
    for (const auto& p : m->named_parameters(true)) {
      if (want.count(p.key())) {
        ++merged;
        EXPECT_TRUE(test::close_to(p.key() + " (merged)", p.value(), want[p.key()].to(at::kFloat), test::kTolFp32));
      } else {
        EXPECT_TRUE(test::identical(p.key() + " (no LoRA)", p.value(), base.at(p.key())));
      }
    }
  }
  EXPECT_EQ(merged, 4) << "CLIP q_proj (both LoRAs), CLIP fc1, T5 q, T5 wo";

  // fp16: T5's `wo` stays fp32 (re-read from the file, transformers' _keep_in_fp32_modules) and
  // still carries its merge; the other weights are the fp32 merge rounded once to fp16.
  auto t5_half = text_models::load_t5_encoder(
      dir.t5_config(), dir.open_weights("text_encoder_2"), at::kHalf, at::kCPU,
      nn::LoraSet(loras, io::LoraTarget::T5, t5_shapes, nn::underscored_names(t5_shapes)).adjust());
  for (const auto& p : t5_half->named_parameters(true)) {
    if (p.key() == wo + ".weight") {
      ASSERT_EQ(p.value().scalar_type(), at::kFloat) << p.key();
      EXPECT_TRUE(test::close_to(p.key() + " (fp16 run, kept in fp32)", p.value(), want[p.key()].to(at::kFloat), test::kTolFp32));
    } else if (p.key() == t5q + ".weight") {
      EXPECT_TRUE(test::close_to(p.key() + " (fp16 run)", p.value().to(at::kFloat), want[p.key()].to(at::kFloat), 1e-3));
    }
  }

  // Stage 1 as rank 0 runs it.
  TextEncoders encoders(dir, at::kFloat, at::kCPU, loras);
  const PromptEmbedding e = encoders.encode("a photo of a cat", "", 64, "prompt");
  const at::Tensor pooled = clip->forward(e.clip_ids.unsqueeze(0)).pooler_output[0];
  const at::Tensor states = t5->forward(e.t5_ids.unsqueeze(0)).last_hidden_state[0];
  EXPECT_TRUE(test::close_to("pooled_prompt_embeds with the LoRAs", e.pooled, pooled, test::kTolFp32));
  EXPECT_TRUE(test::close_to("prompt_embeds with the LoRAs", e.prompt_embeds, states, test::kTolFp32));
  TextEncoders plain(dir, at::kFloat, at::kCPU);
  const PromptEmbedding p = plain.encode("a photo of a cat", "", 64, "prompt");
  EXPECT_FALSE(at::allclose(p.pooled, e.pooled)) << "the LoRAs change the pooled output";
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace fluxmpi::pipeline
