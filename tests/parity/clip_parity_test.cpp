// Parity of the CLIP text encoder with transformers CLIPTextModel on the reference fixtures:
// every `clip_forward` case (embeddings, every layer, last hidden state, pooled output) and the
// pooled_prompt_embeds of every `pipeline` case, in fp32 at kTolFp32; plus a bf16 sanity bound.

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "io/model_dir.h"
#include "models/clip_text.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::text_models {
namespace {

using test::CaseRef;

/// The output of our model that a recorded tensor of a clip_forward case names; undefined for a
/// name this test does not know (reported as a failure by close_to).
at::Tensor recorded_counterpart(const ClipTextOutput& out, const std::string& name) {
  if (name == "embeddings_out") return out.embeddings;
  if (name == "out_last_hidden_state") return out.last_hidden_state;
  if (name == "out_pooler_output") return out.pooler_output;
  for (size_t i = 0; i < out.layer_outputs.size(); ++i)
    if (name == "layer_" + std::to_string(i) + "_out") return out.layer_outputs[i];
  return {};
}

class ClipForward : public testing::TestWithParam<CaseRef> {};

TEST_P(ClipForward, MatchesEveryRecordedTensorFp32) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  io::ModelDir dir(c.model_dir);
  ClipTextModel model = load_clip_text_model(dir, at::kFloat, at::kCPU);
  test::CaseTensors tensors(c.file);
  ClipTextOutput out = model->forward(tensors.get("in_input_ids"), /*trace=*/true);

  const auto& listed = c.json.at("tensors");
  for (int64_t i = 0; i < model->config().num_hidden_layers; ++i)
    EXPECT_TRUE(listed.contains("layer_" + std::to_string(i) + "_out"))
        << test::case_label(c) << ": the case records no output of layer " << i;
  test::expect_recorded_tensors(c, tensors, [&](const std::string& name) { return recorded_counterpart(out, name); },
                                test::kTolFp32);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ClipForward, testing::ValuesIn(test::cases_of_kind("clip_forward")),
                         test::case_test_name);

class ClipPipeline : public testing::TestWithParam<CaseRef> {};

TEST_P(ClipPipeline, PooledPromptEmbedsFromStoredIdsFp32) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  io::ModelDir dir(c.model_dir);
  ClipTextModel model = load_clip_text_model(dir, at::kFloat, at::kCPU);
  test::CaseTensors tensors(c.file);
  at::Tensor ids = tensors.get("clip_input_ids");  // [prompts, 77]
  at::Tensor ref = tensors.get("pooled_prompt_embeds");  // [prompts * images per prompt, D]
  ASSERT_EQ(ref.size(0) % ids.size(0), 0) << test::case_label(c) << ": pooled rows are not a multiple of prompts";
  // The pipeline repeats each prompt's embedding for its images, prompt-major.
  at::Tensor pooled = model->forward(ids).pooler_output.repeat_interleave(ref.size(0) / ids.size(0), 0);
  testing::AssertionResult r =
      test::close_to(test::case_label(c) + " pooled_prompt_embeds", pooled, ref, test::kTolFp32);
  EXPECT_TRUE(r);
  std::printf("  %s\n", r.message());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ClipPipeline, testing::ValuesIn(test::cases_of_kind("pipeline")),
                         test::case_test_name);

class ClipBf16 : public testing::TestWithParam<CaseRef> {};

TEST_P(ClipBf16, RunDtypeStaysNearFp32Reference) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  io::ModelDir dir(c.model_dir);
  ClipTextModel model = load_clip_text_model(dir, at::kBFloat16, at::kCPU);
  test::CaseTensors tensors(c.file);
  ClipTextOutput out = model->forward(tensors.get("in_input_ids"));
  EXPECT_EQ(out.last_hidden_state.scalar_type(), at::kBFloat16);
  for (const char* name : {"out_last_hidden_state", "out_pooler_output"}) {
    at::Tensor got = std::string(name) == "out_pooler_output" ? out.pooler_output : out.last_hidden_state;
    testing::AssertionResult r =
        test::close_to(test::case_label(c) + " " + name + " (bf16 run)", got, tensors.get(name), test::kTolBf16Sanity);
    EXPECT_TRUE(r);
    std::printf("  %s\n", r.message());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ClipBf16, testing::ValuesIn(test::cases_of_kind("clip_forward")),
                         test::case_test_name);

}  // namespace
}  // namespace fluxmpi::text_models
