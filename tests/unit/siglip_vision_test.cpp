// The SigLIP vision encoder, the Redux embedder and the prior's arithmetic without fixtures: module
// names and parameter counts, what the loaders refuse (one WeightError naming key and file), the
// patch grid, and redux_prompt's scales and sum against a hand computation.

#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "core/error.h"
#include "io/safetensors_writer.h"
#include "models/siglip/redux_embedder.h"
#include "models/siglip/redux_prior.h"
#include "models/siglip/siglip_vision.h"

namespace fluxmpi::siglip {
namespace {
namespace fs = std::filesystem;

io::SiglipVisionConfig tiny_config() {
  io::SiglipVisionConfig c;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.image_size = 30;
  c.patch_size = 14;  // 2 x 2 patches; the last 2 pixel rows and columns are never read
  return c;
}

// Every parameter of `model` under its name, random, plus `extra` keys, as one safetensors file.
std::string write_weights(const torch::nn::Module& model, const std::vector<std::string>& extra,
                          const std::string& drop = "") {
  io::SafetensorsWriter w;
  std::vector<at::Tensor> keep;
  at::manual_seed(0);
  for (const auto& p : model.named_parameters()) {
    if (p.key() == drop) continue;
    keep.push_back(at::randn(p.value().sizes()) * 0.3);
    w.add(p.key(), io::DType::F32, keep.back().sizes().vec(), keep.back().data_ptr(), keep.back().nbytes());
  }
  const float one = 1.0f;
  for (const auto& k : extra) w.add(k, io::DType::F32, {1}, &one, sizeof one);
  const std::string path =
      (fs::temp_directory_path() / ("fluxmpi_siglip_test_" + std::to_string(::getpid()) + ".safetensors")).string();
  w.write(path);
  return path;
}

TEST(SiglipVision, ParametersCarryTheTransformersKeys) {
  SiglipVisionModel m(tiny_config());
  std::vector<std::string> names;
  int64_t count = 0;
  for (const auto& p : m->named_parameters()) {
    names.push_back(p.key());
    count += p.value().numel();
  }
  for (const char* key : {"vision_model.embeddings.patch_embedding.weight", "vision_model.embeddings.position_embedding.weight",
                          "vision_model.encoder.layers.1.self_attn.q_proj.bias", "vision_model.encoder.layers.0.layer_norm1.weight",
                          "vision_model.encoder.layers.0.mlp.fc2.weight", "vision_model.post_layernorm.bias"})
    EXPECT_NE(std::find(names.begin(), names.end(), key), names.end()) << key;
  EXPECT_EQ(count, tiny_config().parameters());
}

TEST(SiglipVision, LoadsSkippingTheHeadAndRunsOnTheWholePatches) {
  const io::SiglipVisionConfig c = tiny_config();
  const std::string path = write_weights(*SiglipVisionModel(c), {"vision_model.head.probe", "vision_model.head.mlp.fc1.weight",
                                                                 "vision_model.embeddings.position_ids"});
  const io::TensorStore store = io::TensorStore::open_file(path, "image_encoder");
  check_siglip_vision_weights(c, store);
  const SiglipVisionModel m = load_siglip_vision_model(c, store, at::kFloat, at::kCPU);
  const at::Tensor pixels = at::randn({2, 3, 30, 30});
  const SiglipVisionOutput out = m->forward(pixels, true);
  EXPECT_EQ(out.last_hidden_state.sizes(), (std::vector<int64_t>{2, 4, 8}));
  ASSERT_EQ(out.layer_outputs.size(), 2u);
  // Pixels outside the whole patches (rows and columns 28, 29) are never read.
  at::Tensor changed = pixels.clone();
  changed.narrow(2, 28, 2).fill_(7.0);
  changed.narrow(3, 28, 2).fill_(-7.0);
  EXPECT_TRUE(at::equal(m->forward(changed).last_hidden_state, out.last_hidden_state));
  // Batch rows are independent.
  EXPECT_TRUE(at::allclose(m->forward(pixels.narrow(0, 1, 1)).last_hidden_state, out.last_hidden_state.narrow(0, 1, 1),
                           1e-5, 1e-6));
  fs::remove(path);
}

TEST(SiglipVision, UnclaimedAndMissingKeysAreWeightErrors) {
  const io::SiglipVisionConfig c = tiny_config();
  const std::string extra = write_weights(*SiglipVisionModel(c), {"vision_model.encoder.layers.2.mlp.fc1.weight"});
  try {
    check_siglip_vision_weights(c, io::TensorStore::open_file(extra, "image_encoder"));
    FAIL() << "no error for an unclaimed key";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("vision_model.encoder.layers.2.mlp.fc1.weight"), std::string::npos) << e.what();
  }
  const std::string missing = write_weights(*SiglipVisionModel(c), {}, "vision_model.post_layernorm.weight");
  try {
    check_siglip_vision_weights(c, io::TensorStore::open_file(missing, "image_encoder"));
    FAIL() << "no error for a missing key";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("vision_model.post_layernorm.weight"), std::string::npos) << e.what();
  }
  io::SiglipVisionConfig wider = c;
  wider.intermediate_size = 16;
  try {
    check_siglip_vision_weights(wider, io::TensorStore::open_file(missing, "image_encoder"));
    FAIL() << "no error for a wrong shape";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.fc1"), std::string::npos) << e.what();
  }
  fs::remove(missing);
}

TEST(SiglipVision, AnInputOfAnotherPatchCountIsRefused) {
  SiglipVisionModel m(tiny_config());
  for (auto& p : m->parameters()) p.data().normal_();
  EXPECT_THROW(m->forward(at::randn({1, 3, 44, 30})), ConfigError);  // 3 x 2 patches, the table has 4
  EXPECT_THROW(m->forward(at::randn({1, 3, 10, 30})), ConfigError);  // smaller than one patch
}

TEST(ReduxEmbedder, UpSiluDown) {
  const io::ReduxEmbedderConfig c{8, 6};
  ReduxImageEncoder m(c);
  for (auto& p : m->parameters()) p.data().normal_();
  const at::Tensor x = at::randn({2, 4, 8});
  const at::Tensor want = at::linear(at::silu(at::linear(x, m->redux_up->weight, m->redux_up->bias)),
                                     m->redux_down->weight, m->redux_down->bias);
  EXPECT_TRUE(at::allclose(m->forward(x), want, 1e-5, 1e-6));
  int64_t count = 0;
  for (const auto& p : m->parameters()) count += p.numel();
  EXPECT_EQ(count, c.parameters());
  EXPECT_EQ((io::ReduxEmbedderConfig{1152, 4096}.parameters()), 64'503'808);  // FLUX.1-Redux-dev's image_embedder
}

// sum_i s_i * cat(text, image_i) with the scales rounded to the embeddings' dtype first.
TEST(ReduxPrior, ScalesConcatenatesAndSums) {
  const at::Tensor text = at::randn({3, 4}), pooled = at::randn({5}), images = at::randn({2, 2, 4});
  const ReduxPrompt r = redux_prompt(text, pooled, images, {1.0, 0.6}, {0.8, 0.5});
  const float a = 1.0f, b = static_cast<float>(0.6), p = static_cast<float>(0.8), q = 0.5f;
  ASSERT_EQ(r.prompt_embeds.sizes(), (std::vector<int64_t>{5, 4}));
  EXPECT_TRUE(at::equal(r.prompt_embeds.narrow(0, 0, 3), text * a + text * b));
  EXPECT_TRUE(at::equal(r.prompt_embeds.narrow(0, 3, 2), images[0] * a + images[1] * b));
  EXPECT_TRUE(at::equal(r.pooled, pooled * p + pooled * q));
  // Zeros stay zeros; one image at scale 1 is the concatenation itself.
  const ReduxPrompt z = redux_prompt(at::zeros({3, 4}), at::zeros({5}), images.narrow(0, 0, 1), {1.0}, {1.0});
  EXPECT_TRUE(at::equal(z.prompt_embeds, at::cat({at::zeros({3, 4}), images[0]}, 0)));
  EXPECT_THROW(redux_prompt(text, pooled, images, {1.0}, {1.0, 1.0}), InternalError);
}

}  // namespace
}  // namespace fluxmpi::siglip
