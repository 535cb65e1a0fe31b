// FLUX.1 Redux's image side against the redux fixtures (tests/fixtures/redux, cases of kind
// redux_encode): the SigLIP image processor (bit for bit), the SigLIP vision encoder (embeddings,
// every layer, last_hidden_state) and the Redux embedder (image_embeds), each at kTolFp32 = 1e-5
// relative, after checking that the reference's own distance to float64 is below that.

#include <gtest/gtest.h>

#include "io/image_file.h"
#include "io/redux_dir.h"
#include "models/siglip/redux_embedder.h"
#include "models/siglip/siglip_processor.h"
#include "models/siglip/siglip_vision.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi::siglip {
namespace {

using test::SubtreeCase;

std::vector<SubtreeCase> encode_cases() {
  return test::project_subtree_cases("redux", [](const std::string& kind) { return kind == "redux_encode"; });
}

// The tolerance must exceed the reference's own error (its distance to the float64 recomputation).
void expect_reference_within(const SubtreeCase& c, const std::string& name, double tol) {
  const auto& t = c.json.at("tensors").at(name);
  ASSERT_TRUE(t.contains("f64_relative")) << c.name << ": " << name << " has no float64 distance in the manifest";
  const double d = t.at("f64_relative").get<double>();
  EXPECT_LT(d, tol) << c.name << ": the reference " << name << " is " << d << " from float64, not below the tolerance " << tol;
}

class SiglipParity : public testing::TestWithParam<SubtreeCase> {};

TEST_P(SiglipParity, ProcessorEncoderAndEmbedderMatch) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "redux");
  const io::ReduxDir dir(c.model_dir);
  const test::CaseTensors ref(c.file);

  // The processor: float32 values bit for bit (the resize is exact, the rest is the same arithmetic).
  const io::Image8 image = io::read_image(c.subtree + "/" + c.json.at("inputs").at(0).get<std::string>());
  const SiglipPixels px = siglip_preprocess(image, dir.processor_config());
  test::expect_identical(c.name + ": pixel_values", px.pixel_values, ref.get("pixel_values"));

  // The encoder, on the reference pixels (so that each module is checked on its own inputs).
  const SiglipVisionModel enc =
      load_siglip_vision_model(dir.encoder_config(), dir.open_weights("image_encoder"), at::kFloat, test::test_device());
  const SiglipVisionOutput out = enc->forward(test::on_test_device(ref.get("pixel_values")), /*trace=*/true);
  expect_reference_within(c, "siglip_embeddings", test::kTolFp32);
  test::expect_close(c.name + ": siglip_embeddings", out.embeddings, ref.get("siglip_embeddings"), test::kTolFp32);
  for (size_t i = 0; i < out.layer_outputs.size(); ++i) {
    const std::string name = "siglip_layer_" + std::to_string(i);
    expect_reference_within(c, name, test::kTolFp32);
    test::expect_close(c.name + ": " + name, out.layer_outputs[i], ref.get(name), test::kTolFp32);
  }
  EXPECT_FALSE(ref.has("siglip_layer_" + std::to_string(out.layer_outputs.size()))) << "the reference has more layers";
  expect_reference_within(c, "last_hidden_state", test::kTolFp32);
  test::expect_close(c.name + ": last_hidden_state", out.last_hidden_state, ref.get("last_hidden_state"), test::kTolFp32);

  // The embedder, on the reference hidden state, then the whole chain from our own pixels.
  const ReduxImageEncoder emb =
      load_redux_embedder(dir.embedder_config(), dir.open_weights("image_embedder"), at::kFloat, test::test_device());
  expect_reference_within(c, "image_embeds", test::kTolFp32);
  test::expect_close(c.name + ": image_embeds", emb->forward(test::on_test_device(ref.get("last_hidden_state"))),
                     ref.get("image_embeds"), test::kTolFp32);
  const at::Tensor chain = emb->forward(enc->forward(test::on_test_device(px.pixel_values)).last_hidden_state);
  test::expect_close(c.name + ": image_embeds from the image file", chain, ref.get("image_embeds"), test::kTolFp32);
}

INSTANTIATE_TEST_SUITE_P(Redux, SiglipParity, testing::ValuesIn(encode_cases()), test::image_case_name);

}  // namespace
}  // namespace fluxmpi::siglip
