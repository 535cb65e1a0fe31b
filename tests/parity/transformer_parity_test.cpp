// FluxTransformer2DModel parity with diffusers: every transformer_forward case of the manifest
// with all its intermediates, and the noise prediction of every step of every pipeline case from
// that step's stored inputs. Tolerance: kTolFp32 (max |diff| <= 1e-5 * max(1, max |ref|)).
// On test::test_device() (FLUXMPI_TEST_DEVICE), at the same tolerance.

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <map>

#include "io/model_dir.h"
#include "models/flux/latents.h"
#include "models/flux/transformer.h"
#include "support/fixtures.h"
#include "support/tensor_compare.h"

namespace fluxmpi::flux {
namespace {

using test::CaseRef;
using test::CaseTensors;
using test::close_to;
using test::kTolFp32;

FluxTransformer load_whole(const std::string& model_dir) {
  io::ModelDir dir(model_dir);
  return load_flux_transformer(dir, TransformerPart::whole(dir.transformer_config()), at::kFloat, test::test_device());
}

class TransformerForward : public testing::TestWithParam<CaseRef> {};

TEST_P(TransformerForward, MatchesEveryIntermediate) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  c10::InferenceMode guard;
  CaseTensors ref(c.file);
  FluxTransformer model = load_whole(c.model_dir);
  TransformerInputs in;
  using test::on_test_device;
  in.latents = on_test_device(ref.get("in_hidden_states"));
  in.text = on_test_device(ref.get("in_encoder_hidden_states"));
  in.pooled = on_test_device(ref.get("in_pooled_projections"));
  in.timestep = on_test_device(ref.get("in_timestep"));
  if (ref.has("in_guidance")) in.guidance = on_test_device(ref.get("in_guidance"));
  const std::string where = test::case_label(c) + ": ";

  StreamState s = model->embed(in);
  EXPECT_TRUE(close_to(where + "x_embedder_out", s.img, ref.get("x_embedder_out"), kTolFp32));
  EXPECT_TRUE(close_to(where + "context_embedder_out", s.txt, ref.get("context_embedder_out"), kTolFp32));
  EXPECT_TRUE(close_to(where + "temb", s.temb, ref.get("temb"), kTolFp32));

  RopeTables rope = model->rope(on_test_device(ref.get("in_txt_ids")), on_test_device(ref.get("in_img_ids")));
  EXPECT_TRUE(close_to(where + "rope_cos", rope.cos, ref.get("rope_cos"), kTolFp32));
  EXPECT_TRUE(close_to(where + "rope_sin", rope.sin, ref.get("rope_sin"), kTolFp32));

  int64_t observed = 0;
  model->run_blocks(s, rope, [&](const std::string& name, const StreamState& st) {
    at::Tensor txt = st.is_joint() ? st.joint.narrow(1, 0, st.text_len) : st.txt;
    at::Tensor img = st.is_joint() ? st.joint.narrow(1, st.text_len, st.joint.size(1) - st.text_len) : st.img;
    EXPECT_TRUE(close_to(where + name + "_txt", txt, ref.get(name + "_txt"), kTolFp32));
    EXPECT_TRUE(close_to(where + name + "_img", img, ref.get(name + "_img"), kTolFp32));
    ++observed;
  });
  EXPECT_EQ(observed, model->config().num_blocks());
  at::Tensor normed;
  at::Tensor out = model->final_layer(s, &normed);
  EXPECT_TRUE(close_to(where + "norm_out_out", normed, ref.get("norm_out_out"), kTolFp32));
  EXPECT_TRUE(close_to(where + "out_sample", out, ref.get("out_sample"), kTolFp32));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformerForward, testing::ValuesIn(test::cases_of_kind("transformer_forward")),
                         test::case_test_name);

class PipelineNoisePrediction : public testing::TestWithParam<CaseRef> {};

// Every transformer call of the pipeline, each from its own stored inputs (so errors do not
// accumulate across steps): step k sees latents_initial (k = 0) or latents_steps[k-1].
TEST_P(PipelineNoisePrediction, EveryStepFromStoredInputs) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  c10::InferenceMode guard;
  CaseTensors ref(c.file);
  FluxTransformer model = load_whole(c.model_dir);
  at::Tensor noise_pred = ref.get("noise_pred");        // [N, n, L, 64]
  at::Tensor steps = test::on_test_device(ref.get("latents_steps"));          // [N, n, L, 64]
  at::Tensor timestep = test::on_test_device(ref.get("transformer_timestep"));  // [N, n]
  const int64_t N = noise_pred.size(0);
  TransformerInputs in;
  in.text = test::on_test_device(ref.get("prompt_embeds"));
  in.pooled = test::on_test_device(ref.get("pooled_prompt_embeds"));
  if (model->config().guidance_embeds) in.guidance = test::on_test_device(ref.get("guidance").expand({noise_pred.size(1)}));
  RopeTables rope = model->rope(test::on_test_device(ref.get("text_ids")), test::on_test_device(ref.get("latent_image_ids")));
  for (int64_t k = 0; k < N; ++k) {
    in.latents = k == 0 ? test::on_test_device(ref.get("latents_initial")) : steps[k - 1];
    in.timestep = timestep[k];
    StreamState s = model->embed(in);
    model->run_blocks(s, rope);
    at::Tensor v = model->final_layer(s);
    EXPECT_TRUE(close_to(test::case_label(c) + ": noise_pred[" + std::to_string(k) + "]", v, noise_pred[k], kTolFp32));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PipelineNoisePrediction, testing::ValuesIn(test::cases_of_kind("pipeline")),
                         test::case_test_name);

// The pipeline's position ids are what FluxPipeline builds from the size alone.
TEST_P(PipelineNoisePrediction, PositionIdsFromSize) {
  const CaseRef& c = GetParam();
  FLUXMPI_REQUIRE_CASE(c);
  CaseTensors ref(c.file);
  const auto hw = c.json["latent_hw"];
  at::Tensor ids = image_position_ids(hw[0].get<int64_t>(), hw[1].get<int64_t>());
  EXPECT_TRUE(test::identical(test::case_label(c) + ": latent_image_ids", ids, ref.get("latent_image_ids")));
  at::Tensor txt = text_position_ids(ref.get("text_ids").size(0));
  EXPECT_TRUE(test::identical(test::case_label(c) + ": text_ids", txt, ref.get("text_ids")));
  at::Tensor packed = pack_latents(ref.get("noise_unpacked"));
  EXPECT_TRUE(test::identical(test::case_label(c) + ": latents_initial", packed, ref.get("latents_initial")));
  at::Tensor unpacked = unpack_latents(packed, hw[0].get<int64_t>(), hw[1].get<int64_t>());
  EXPECT_TRUE(test::identical(test::case_label(c) + ": unpack(pack(noise))", unpacked, ref.get("noise_unpacked")));
}

}  // namespace
}  // namespace fluxmpi::flux
