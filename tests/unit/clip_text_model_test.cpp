// The CLIP text model without fixtures: loading rules (ignored position_ids buffer and
// text_projection, unexpected and missing keys, config/weights disagreement), the pooling rule,
// the causal mask.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "io/safetensors_writer.h"
#include "models/clip_text.h"
#include "models/common/init.h"
#include "support/tensor_compare.h"

namespace fluxmpi::text_models {
namespace {

io::ClipTextConfig tiny_config(int64_t layers = 2) {
  io::ClipTextConfig c;
  c.vocab_size = 60;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 12;
  c.eos_token_id = 2;
  return c;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("fluxmpi-clip-" + std::to_string(::getpid()) + "-" + name)).string();
}

void add(io::SafetensorsWriter& w, const std::string& key, const at::Tensor& value, io::DType dtype = io::DType::F32) {
  at::Tensor t = value.contiguous();
  w.add(key, dtype, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr(),
        static_cast<size_t>(t.numel() * t.element_size()));
}

/// Writes a random model of `config` (all its parameters, plus `extra`) and returns it with the path.
std::pair<ClipTextModel, std::string> write_model(const io::ClipTextConfig& config,
                                                  const std::function<void(io::SafetensorsWriter&)>& extra = {}) {
  ClipTextModel source(config);
  nn::fill_random(*source, 21);
  io::SafetensorsWriter w;
  nn::add_parameters(w, *source, "", io::DType::F32);
  if (extra) extra(w);
  std::string path = temp_path(std::to_string(std::rand()) + ".safetensors");
  w.write(path);
  return {source, path};
}

std::string load_error(const io::ClipTextConfig& config, const std::string& path) {
  try {
    io::TensorStore store = io::TensorStore::open_file(path, "test CLIP");
    load_clip_text_model(config, store, at::kFloat, at::kCPU);
  } catch (const WeightError& e) {
    return e.what();
  }
  return "";
}

/// [BOS-like 1, tokens..., EOS 2, pad 2...] rows, as the CLIP tokenizer pads with EOS.
at::Tensor sample_ids() {
  return at::tensor({1, 7, 9, 30, 2, 2, 2, 2, 1, 44, 59, 12, 13, 5, 2, 2}, at::kLong).view({2, 8});
}

TEST(ClipTextModel, ParameterNamesAreTransformersKeys) {
  ClipTextModel m(tiny_config());
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  auto has = [&](const std::string& k) { return std::find(names.begin(), names.end(), k) != names.end(); };
  EXPECT_TRUE(has("text_model.embeddings.token_embedding.weight"));
  EXPECT_TRUE(has("text_model.embeddings.position_embedding.weight"));
  EXPECT_TRUE(has("text_model.encoder.layers.1.self_attn.q_proj.bias"));
  EXPECT_TRUE(has("text_model.encoder.layers.1.self_attn.out_proj.weight"));
  EXPECT_TRUE(has("text_model.encoder.layers.0.mlp.fc2.bias"));
  EXPECT_TRUE(has("text_model.encoder.layers.0.layer_norm2.weight"));
  EXPECT_TRUE(has("text_model.final_layer_norm.bias"));
  EXPECT_EQ(names.size(), 2u + 2 * 16 + 2);  // embeddings, 2 layers of 16, final norm
}

TEST(ClipTextModel, RoundTripsThroughAFile) {
  auto [source, path] = write_model(tiny_config());
  io::TensorStore store = io::TensorStore::open_file(path, "test CLIP");
  ClipTextModel loaded = load_clip_text_model(tiny_config(), store, at::kFloat, at::kCPU);
  ClipTextOutput a = loaded->forward(sample_ids()), b = source->forward(sample_ids());
  EXPECT_TRUE(test::identical("last_hidden_state", a.last_hidden_state, b.last_hidden_state));
  EXPECT_TRUE(test::identical("pooler_output", a.pooler_output, b.pooler_output));
  std::filesystem::remove(path);
}

TEST(ClipTextModel, PositionIdsBufferTextProjectionAndLogitScaleAreIgnored) {
  auto [source, path] = write_model(tiny_config(), [](io::SafetensorsWriter& w) {
    add(w, "text_model.embeddings.position_ids", at::arange(12, at::kLong).view({1, 12}), io::DType::I64);
    add(w, "text_projection.weight", at::ones({16, 16}));
    add(w, "logit_scale", at::full({}, 4.6052f));  // as in the clip_l files ComfyUI saves
  });
  EXPECT_EQ(load_error(tiny_config(), path), "");
  std::filesystem::remove(path);
}

TEST(ClipTextModel, UnexpectedKeyIsAnError) {
  auto [source, path] = write_model(tiny_config(), [](io::SafetensorsWriter& w) {
    add(w, "text_model.encoder.layers.0.self_attn.qkv_proj.weight", at::ones({48, 16}));
  });
  std::string msg = load_error(tiny_config(), path);
  EXPECT_NE(msg.find("unexpected tensor 'text_model.encoder.layers.0.self_attn.qkv_proj.weight'"), std::string::npos)
      << msg;
  std::filesystem::remove(path);
}

TEST(ClipTextModel, ConfigWithMoreLayersThanTheFileNamesTheMissingKey) {
  auto [source, path] = write_model(tiny_config(2));
  std::string msg = load_error(tiny_config(3), path);
  EXPECT_NE(msg.find("tensor 'text_model.encoder.layers.2."), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
  std::filesystem::remove(path);
}

TEST(ClipTextModel, ConfigWidthDisagreeingWithTheFileNamesTheShape) {
  auto [source, path] = write_model(tiny_config());
  io::ClipTextConfig more_positions = tiny_config();
  more_positions.max_position_embeddings = 77;
  std::string msg = load_error(more_positions, path);
  EXPECT_NE(msg.find("tensor 'text_model.embeddings.position_embedding.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has shape [12, 16], expected [77, 16]"), std::string::npos) << msg;
  std::filesystem::remove(path);
}

TEST(ClipTextModel, PoolingRule) {
  // Legacy configs (eos_token_id 2): argmax of the ids, the first one when tied.
  at::Tensor ids = at::tensor({1, 2, 9, 2, 1, 30, 30, 2}, at::kLong).view({2, 4});
  EXPECT_TRUE(test::identical("legacy", clip_pool_positions(ids, 2), at::tensor({2, 1}, at::kLong)));
  // Otherwise the first position holding eos_token_id; a row without one pools position 0.
  at::Tensor ids2 = at::tensor({1, 5, 9, 5, 1, 3, 4, 6}, at::kLong).view({2, 4});
  EXPECT_TRUE(test::identical("first eos", clip_pool_positions(ids2, 5), at::tensor({1, 0}, at::kLong)));
}

TEST(ClipTextModel, PooledOutputIsTheHiddenStateAtThePooledPosition) {
  ClipTextModel m(tiny_config());
  nn::fill_random(*m, 4);
  ClipTextOutput out = m->forward(sample_ids());
  EXPECT_TRUE(test::identical("row 0", out.pooler_output[0], out.last_hidden_state[0][3]));  // id 30
  EXPECT_TRUE(test::identical("row 1", out.pooler_output[1], out.last_hidden_state[1][2]));  // id 59
}

TEST(ClipTextModel, AttentionIsCausal) {
  // Changing a later token must leave every earlier position untouched.
  ClipTextModel m(tiny_config());
  nn::fill_random(*m, 8);
  at::Tensor ids = sample_ids();
  at::Tensor changed = ids.clone();
  changed[0][5] = 17;
  ClipTextOutput a = m->forward(ids, /*trace=*/true), b = m->forward(changed, /*trace=*/true);
  ASSERT_EQ(a.layer_outputs.size(), 2u);
  EXPECT_TRUE(test::identical("prefix", b.last_hidden_state[0].narrow(0, 0, 5), a.last_hidden_state[0].narrow(0, 0, 5)));
  EXPECT_FALSE(test::identical("changed position", b.last_hidden_state[0][5], a.last_hidden_state[0][5]));
}

TEST(ClipTextModel, BadInputsAreReported) {
  ClipTextModel m(tiny_config());
  nn::fill_random(*m, 1);
  EXPECT_THROW(m->forward(at::tensor({1, 60, 2}, at::kLong).view({1, 3})), ConfigError);
  EXPECT_THROW(m->forward(at::ones({1, 13}, at::kLong)), InternalError);  // 12 positions
}

}  // namespace
}  // namespace fluxmpi::text_models
