// FluxControlNetModel and FluxTransformer2DModel-with-residuals parity with diffusers 0.40, on the
// module cases of the ControlNet fixtures (tests/fixtures/controlnet, tools/fixtures/controlnet.py):
// every intermediate of the ControlNet's forward (embedders, mode token, input_hint_block, RoPE,
// every block, every residual sample) and every block of the transformer given residual samples
// (interval, full and repeated layouts). Tolerance kTolFp32 (max |diff| <= 1e-5 * max(1, max |ref|)),
// above each reference's recorded distance to float64 (at most 1e-6 here).

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include "io/model_dir.h"
#include "models/flux/controlnet.h"
#include "models/flux/transformer.h"
#include "support/controlnet_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::flux {
namespace {

using test::expect_close;
using test::kTolFp32;
using test::on_test_device;
using test::SubtreeCase;

class ControlNetForward : public testing::TestWithParam<SubtreeCase> {};

TEST_P(ControlNetForward, MatchesEveryIntermediate) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, test::kControlNetSubtree);
  ASSERT_TRUE(test::tolerance_above_f64(c, kTolFp32));
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  FluxControlNet net = load_flux_controlnet(test::controlnet_dir(c, c.json.at("net")), at::kFloat, test::test_device());
  const io::ControlNetConfig& cfg = net->config();
  const std::string at_case = c.name + ": ";
  const double scale = c.json.at("conditioning_scale").get<double>();

  at::Tensor condition = net->embed_condition(on_test_device(ref.get("in_controlnet_cond")));
  if (cfg.takes_pixels())
    expect_close(at_case + "input_hint_block_out", net->input_hint_block->forward(on_test_device(ref.get("in_controlnet_cond"))),
                 ref.get("input_hint_block_out"), kTolFp32);
  expect_close(at_case + "controlnet_x_embedder_out", condition, ref.get("controlnet_x_embedder_out"), kTolFp32);

  ControlNetInputs in;
  in.latents = on_test_device(ref.get("in_hidden_states"));
  in.condition = condition;
  in.text = on_test_device(ref.get("in_encoder_hidden_states"));
  in.pooled = on_test_device(ref.get("in_pooled_projections"));
  in.timestep = on_test_device(ref.get("in_timestep"));
  if (ref.has("in_guidance")) in.guidance = on_test_device(ref.get("in_guidance"));
  if (ref.has("in_controlnet_mode")) in.mode = on_test_device(ref.get("in_controlnet_mode")).view({-1});
  StreamState s = net->embed(in);
  expect_close(at_case + "x_embedder_out + controlnet_x_embedder_out", s.img,
               ref.get("x_embedder_out") + ref.get("controlnet_x_embedder_out"), kTolFp32);
  expect_close(at_case + "temb", s.temb, ref.get("temb"), kTolFp32);
  const int64_t S = in.text.size(1);
  ASSERT_EQ(s.text_len, cfg.text_tokens(S));
  expect_close(at_case + "context_embedder_out", s.txt.narrow(1, s.text_len - S, S), ref.get("context_embedder_out"), kTolFp32);
  if (cfg.is_union())
    expect_close(at_case + "controlnet_mode_embedder_out", s.txt.narrow(1, 0, 1), ref.get("controlnet_mode_embedder_out"), kTolFp32);

  RopeTables rope = net->rope(on_test_device(ref.get("in_txt_ids")), on_test_device(ref.get("in_img_ids")));
  expect_close(at_case + "rope_cos", rope.cos, ref.get("rope_cos"), kTolFp32);
  expect_close(at_case + "rope_sin", rope.sin, ref.get("rope_sin"), kTolFp32);

  int64_t observed = 0;
  const std::vector<at::Tensor> samples = net->run_blocks(s, rope, scale, nullptr, [&](const std::string& name, const StreamState& st) {
    const at::Tensor txt = st.is_joint() ? st.joint.narrow(1, 0, st.text_len) : st.txt;
    const at::Tensor img = st.is_joint() ? st.joint.narrow(1, st.text_len, st.joint.size(1) - st.text_len) : st.img;
    expect_close(at_case + name + "_txt", txt, ref.get(name + "_txt"), kTolFp32);
    expect_close(at_case + name + "_img", img, ref.get(name + "_img"), kTolFp32);
    ++observed;
  });
  EXPECT_EQ(observed, cfg.num_blocks());
  ASSERT_EQ(static_cast<int64_t>(samples.size()), cfg.num_blocks());
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string name = "controlnet_block_sample_" + std::to_string(i);
    expect_close(at_case + name, samples[static_cast<size_t>(i)], ref.get(name), kTolFp32);
  }
  for (int64_t j = 0; j < cfg.num_single_layers; ++j) {
    const std::string name = "controlnet_single_block_sample_" + std::to_string(j);
    expect_close(at_case + name, samples[static_cast<size_t>(cfg.num_layers + j)], ref.get(name), kTolFp32);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ControlNetForward, testing::ValuesIn(test::controlnet_cases("controlnet_forward")),
                         test::image_case_name);

class TransformerWithResiduals : public testing::TestWithParam<SubtreeCase> {};

// diffusers adds each sample to the block's image tokens after the block; its hooks record the
// block's output before that, so the state after block b is the reference plus b's sample.
TEST_P(TransformerWithResiduals, EveryBlockAndTheOutput) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, test::kControlNetSubtree);
  FLUXMPI_REQUIRE_FIXTURES();
  ASSERT_TRUE(test::tolerance_above_f64(c, kTolFp32));
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  io::ModelDir dir(test::controlnet_base_dir(c));
  FluxTransformer model =
      load_flux_transformer(dir, TransformerPart::whole(dir.transformer_config()), at::kFloat, test::test_device());
  const io::TransformerConfig& t = model->config();
  io::ResidualLayout layout;
  layout.double_samples = c.json.at("double_samples").get<int64_t>();
  layout.single_samples = c.json.at("single_samples").get<int64_t>();
  layout.repeat = c.json.at("controlnet_blocks_repeat").get<bool>();
  auto sample = [&](int64_t k) {
    return k < layout.double_samples ? ref.get("in_controlnet_block_sample_" + std::to_string(k))
                                     : ref.get("in_controlnet_single_block_sample_" + std::to_string(k - layout.double_samples));
  };
  BlockResiduals residuals;
  for (int64_t b = 0; b < t.num_blocks(); ++b) {
    const int64_t k = layout.sample_of_block(b, t);
    residuals.push_back(k < 0 ? at::Tensor() : on_test_device(sample(k)));
  }

  TransformerInputs in;
  in.latents = on_test_device(ref.get("in_hidden_states"));
  in.text = on_test_device(ref.get("in_encoder_hidden_states"));
  in.pooled = on_test_device(ref.get("in_pooled_projections"));
  in.timestep = on_test_device(ref.get("in_timestep"));
  in.guidance = on_test_device(ref.get("in_guidance"));
  StreamState s = model->embed(in);
  const RopeTables rope = model->rope(on_test_device(ref.get("in_txt_ids")), on_test_device(ref.get("in_img_ids")));
  int64_t block = 0;
  model->run_blocks(s, rope, [&](const std::string& name, const StreamState& st) {
    const at::Tensor txt = st.is_joint() ? st.joint.narrow(1, 0, st.text_len) : st.txt;
    const at::Tensor img = st.is_joint() ? st.joint.narrow(1, st.text_len, st.joint.size(1) - st.text_len) : st.img;
    const int64_t k = layout.sample_of_block(block++, t);
    expect_close(c.name + ": " + name + "_txt", txt, ref.get(name + "_txt"), kTolFp32);
    expect_close(c.name + ": " + name + "_img + sample " + std::to_string(k), img,
                 k < 0 ? ref.get(name + "_img") : ref.get(name + "_img") + sample(k), kTolFp32);
  }, nullptr, &residuals);
  EXPECT_EQ(block, t.num_blocks());
  expect_close(c.name + ": out_sample", model->final_layer(s), ref.get("out_sample"), kTolFp32);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformerWithResiduals,
                         testing::ValuesIn(test::controlnet_cases("transformer_controlnet")), test::image_case_name);

}  // namespace
}  // namespace fluxmpi::flux
