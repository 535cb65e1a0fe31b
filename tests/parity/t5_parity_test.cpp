// Parity of the T5 encoder with transformers T5EncoderModel on the reference fixtures: every
// `t5_forward` case (embeddings, position bias, every block, last hidden state) and the
// prompt_embeds of every `pipeline` case, in fp32 at kTolFp32; plus a bf16 sanity bound. On
// test::test_device() (FLUXMPI_TEST_DEVICE).

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "io/model_dir.h"
#include "models/t5_encoder.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::text_models {
namespace {

using test::CaseRef;

/// The output of our model that a recorded tensor of a t5_forward case names; undefined for a
/// name this test does not know (reported as a failure by close_to).
at::Tensor recorded_counterpart(const T5EncoderOutput& out, const std::string& name) {
  if (name == "embeddings_out") return out.embeddings;
  if (name == "position_bias") return out.position_bias;
  if (name == "out_last_hidden_state") return out.last_hidden_state;
  for (size_t i = 0; i < out.block_outputs.size(); ++i)
    if (name == "block_" + std::to_string(i) + "_out") return out.block_outputs[i];
  return {};
}

class T5Forward : public testing::TestWithParam<CaseRef> {};

TEST_P(T5Forward, MatchesEveryRecordedTensorFp32) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  io::ModelDir dir(c.model_dir);
  T5EncoderModel model = load_t5_encoder(dir, at::kFloat, test::test_device());
  test::CaseTensors tensors(c.file);
  T5EncoderOutput out = model->forward(test::on_test_device(tensors.get("in_input_ids")), /*trace=*/true);

  const auto& listed = c.json.at("tensors");
  for (int64_t i = 0; i < model->config().num_layers; ++i)
    EXPECT_TRUE(listed.contains("block_" + std::to_string(i) + "_out"))
        << test::case_label(c) << ": the case records no output of block " << i;
  EXPECT_TRUE(listed.contains("position_bias")) << test::case_label(c) << ": the case records no position bias";
  test::expect_recorded_tensors(c, tensors, [&](const std::string& name) { return recorded_counterpart(out, name); },
                                test::kTolFp32);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, T5Forward, testing::ValuesIn(test::cases_of_kind("t5_forward")),
                         test::case_test_name);

class T5Pipeline : public testing::TestWithParam<CaseRef> {};

TEST_P(T5Pipeline, PromptEmbedsFromStoredIdsFp32) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  io::ModelDir dir(c.model_dir);
  T5EncoderModel model = load_t5_encoder(dir, at::kFloat, test::test_device());
  test::CaseTensors tensors(c.file);
  at::Tensor ids = test::on_test_device(tensors.get("t5_input_ids"));     // [prompts, max_sequence_length]
  at::Tensor ref = tensors.get("prompt_embeds");    // [prompts * images per prompt, S, D]
  ASSERT_EQ(ref.size(0) % ids.size(0), 0) << test::case_label(c) << ": embedding rows are not a multiple of prompts";
  // The pipeline repeats each prompt's embeddings for its images, prompt-major.
  at::Tensor embeds = model->forward(ids).last_hidden_state.repeat_interleave(ref.size(0) / ids.size(0), 0);
  testing::AssertionResult r = test::close_to(test::case_label(c) + " prompt_embeds", embeds, ref, test::kTolFp32);
  EXPECT_TRUE(r);
  std::printf("  %s\n", r.message());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, T5Pipeline, testing::ValuesIn(test::cases_of_kind("pipeline")),
                         test::case_test_name);

class T5Bf16 : public testing::TestWithParam<CaseRef> {};

TEST_P(T5Bf16, RunDtypeStaysNearFp32Reference) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  io::ModelDir dir(c.model_dir);
  T5EncoderModel model = load_t5_encoder(dir, at::kBFloat16, test::test_device());
  test::CaseTensors tensors(c.file);
  T5EncoderOutput out = model->forward(test::on_test_device(tensors.get("in_input_ids")));
  EXPECT_EQ(out.last_hidden_state.scalar_type(), at::kBFloat16);
  testing::AssertionResult r = test::close_to(test::case_label(c) + " out_last_hidden_state (bf16 run)",
                                              out.last_hidden_state, tensors.get("out_last_hidden_state"),
                                              test::kTolBf16Sanity);
  EXPECT_TRUE(r);
  std::printf("  %s\n", r.message());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, T5Bf16, testing::ValuesIn(test::cases_of_kind("t5_forward")),
                         test::case_test_name);

}  // namespace
}  // namespace fluxmpi::text_models
