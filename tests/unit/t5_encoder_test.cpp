// The T5 encoder without fixtures: loading rules (tied embedding, ignored decoder, unexpected and
// missing keys, config/weights disagreement), relative position buckets, eager bf16 attention,
// fp16 handling.

#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <optional>

#include "core/error.h"
#include "io/safetensors_writer.h"
#include "models/common/init.h"
#include "models/t5_encoder.h"
#include "support/tensor_compare.h"

namespace fluxmpi::text_models {
namespace {

io::T5Config tiny_config(int64_t layers = 2) {
  io::T5Config c;
  c.vocab_size = 50;
  c.d_model = 16;
  c.d_kv = 4;
  c.num_heads = 2;
  c.d_ff = 24;
  c.num_layers = layers;
  c.gated = true;
  c.act = "gelu_new";
  return c;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("fluxmpi-t5-" + std::to_string(::getpid()) + "-" + name)).string();
}

void add(io::SafetensorsWriter& w, const std::string& key, const at::Tensor& value) {
  at::Tensor t = value.to(at::kFloat).contiguous();
  w.add(key, io::DType::F32, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr(),
        static_cast<size_t>(t.numel()) * 4);
}

/// A random model of `config`, written with `edit` applied to the list of (key, tensor) pairs.
struct Written {
  T5EncoderModel source{nullptr};
  std::string path;
};

Written write_model(const io::T5Config& config, const std::function<void(io::SafetensorsWriter&,
                                                                          const T5EncoderModel&)>& extra = {},
                    const std::function<bool(const std::string&)>& keep = {},
                    const std::string& rename_shared = "") {
  Written out{T5EncoderModel(config), temp_path(std::to_string(std::rand()) + ".safetensors")};
  nn::fill_random(*out.source, 11);
  io::SafetensorsWriter w;
  for (const auto& p : out.source->named_parameters()) {
    if (keep && !keep(p.key())) continue;
    add(w, p.key() == "shared.weight" && !rename_shared.empty() ? rename_shared : p.key(), p.value());
  }
  if (extra) extra(w, out.source);
  w.write(out.path);
  return out;
}

std::string load_error(const io::T5Config& config, const std::string& path) {
  try {
    io::TensorStore store = io::TensorStore::open_file(path, "test T5");
    load_t5_encoder(config, store, at::kFloat, at::kCPU);
  } catch (const WeightError& e) {
    return e.what();
  }
  return "";
}

/// fp16 runs need an fp16 matmul: Debian's CPU libtorch 1.13 has no Half kernel for addmm,
/// a CUDA build has one. Returns the device to run fp16 on, or nullopt.
std::optional<at::Device> fp16_device() {
  at::Device device = at::hasCUDA() ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  try {
    at::linear(at::ones({1, 1}, at::TensorOptions().dtype(at::kHalf).device(device)),
               at::ones({1, 1}, at::TensorOptions().dtype(at::kHalf).device(device)));
  } catch (const c10::Error&) {
    return std::nullopt;
  }
  return device;
}

#define REQUIRE_FP16_DEVICE(device)                                                             \
  std::optional<at::Device> device = fp16_device();                                            \
  if (!device) GTEST_SKIP() << "this libtorch has no fp16 matmul on the CPU and no CUDA device"

at::Tensor sample_ids() { return at::arange(0, 40, at::kLong).remainder(50).view({2, 20}); }

TEST(T5Encoder, ParameterNamesAreTransformersKeys) {
  T5EncoderModel m(tiny_config());
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  auto has = [&](const std::string& k) { return std::find(names.begin(), names.end(), k) != names.end(); };
  EXPECT_TRUE(has("shared.weight"));
  EXPECT_TRUE(has("encoder.block.0.layer.0.SelfAttention.q.weight"));
  EXPECT_TRUE(has("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"));
  EXPECT_FALSE(has("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"));
  EXPECT_TRUE(has("encoder.block.1.layer.1.DenseReluDense.wi_0.weight"));
  EXPECT_TRUE(has("encoder.block.1.layer.1.DenseReluDense.wo.weight"));
  EXPECT_TRUE(has("encoder.block.1.layer.1.layer_norm.weight"));
  EXPECT_TRUE(has("encoder.final_layer_norm.weight"));
  EXPECT_FALSE(has("encoder.embed_tokens.weight")) << "the tied table must not be a second parameter";
  EXPECT_EQ(names.size(), 1u + 2 * 9 + 1 + 1);  // shared, 2 blocks of 9, block 0's bias, final norm
}

TEST(T5Encoder, TiedEmbeddingLoadsUnderEitherKeyOrBoth) {
  io::T5Config c = tiny_config();
  at::Tensor ids = sample_ids();
  for (const std::string& layout : {"shared", "embed_tokens", "both"}) {
    Written w = write_model(
        c,
        [&](io::SafetensorsWriter& wr, const T5EncoderModel& src) {
          if (layout == "both") add(wr, "encoder.embed_tokens.weight", src->shared->weight);
        },
        {}, layout == "embed_tokens" ? "encoder.embed_tokens.weight" : "");
    io::TensorStore store = io::TensorStore::open_file(w.path, "test T5");
    T5EncoderModel loaded = load_t5_encoder(c, store, at::kFloat, at::kCPU);
    EXPECT_TRUE(test::identical(layout + ": shared.weight", loaded->shared->weight, w.source->shared->weight));
    EXPECT_TRUE(test::identical(layout + ": last_hidden_state", loaded->forward(ids).last_hidden_state,
                                w.source->forward(ids).last_hidden_state));
    std::filesystem::remove(w.path);
  }
}

TEST(T5Encoder, MissingEmbeddingNamesTheKey) {
  io::T5Config c = tiny_config();
  Written w = write_model(c, {}, [](const std::string& k) { return k != "shared.weight"; });
  EXPECT_EQ(load_error(c, w.path), "test T5: tensor 'shared.weight' not found (expected shape [50, 16])");
  std::filesystem::remove(w.path);
}

TEST(T5Encoder, DecoderAndLmHeadKeysAreIgnored) {
  io::T5Config c = tiny_config();
  Written w = write_model(c, [](io::SafetensorsWriter& wr, const T5EncoderModel&) {
    add(wr, "decoder.block.0.layer.0.SelfAttention.q.weight", at::ones({8, 16}));
    add(wr, "decoder.final_layer_norm.weight", at::ones({16}));
    add(wr, "lm_head.weight", at::ones({50, 16}));
  });
  EXPECT_EQ(load_error(c, w.path), "");
  std::filesystem::remove(w.path);
}

TEST(T5Encoder, UnexpectedKeyIsAnError) {
  io::T5Config c = tiny_config();
  // Only block 0 owns a relative attention bias in T5 v1.1: a table in block 1 is claimed by nobody.
  Written w = write_model(c, [](io::SafetensorsWriter& wr, const T5EncoderModel&) {
    add(wr, "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight", at::ones({32, 2}));
  });
  std::string msg = load_error(c, w.path);
  EXPECT_NE(msg.find("unexpected tensor 'encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight'"),
            std::string::npos)
      << msg;
  std::filesystem::remove(w.path);
}

TEST(T5Encoder, ConfigWithMoreLayersThanTheFileNamesTheMissingKey) {
  Written w = write_model(tiny_config(2));
  std::string msg = load_error(tiny_config(3), w.path);
  EXPECT_NE(msg.find("tensor 'encoder.block.2.layer.0.SelfAttention.q.weight' not found"), std::string::npos) << msg;
  std::filesystem::remove(w.path);
}

TEST(T5Encoder, ConfigWidthDisagreeingWithTheFileNamesTheShape) {
  Written w = write_model(tiny_config());
  io::T5Config wider = tiny_config();
  wider.d_ff = 32;
  std::string msg = load_error(wider, w.path);
  EXPECT_NE(msg.find("tensor 'encoder.block.0.layer.1.DenseReluDense.wi_0.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has shape [24, 16], expected [32, 16]"), std::string::npos) << msg;
  std::filesystem::remove(w.path);
}

TEST(T5Encoder, NonGatedFeedForwardUsesWi) {
  io::T5Config c = tiny_config();
  c.gated = false;
  c.act = "relu";
  T5EncoderModel m(c);
  bool has_wi = false, has_wi_0 = false;
  for (const auto& p : m->named_parameters()) {
    has_wi |= p.key() == "encoder.block.0.layer.1.DenseReluDense.wi.weight";
    has_wi_0 |= p.key().find("wi_0") != std::string::npos;
  }
  EXPECT_TRUE(has_wi);
  EXPECT_FALSE(has_wi_0);
}

TEST(T5Encoder, RelativePositionBuckets) {
  // transformers' bidirectional bucketing with 32 buckets, max distance 128: 16 per sign, the
  // first 8 exact, then log bins reaching bucket 15 at distance 128 and saturating beyond.
  at::Tensor rp = at::tensor({0, 1, -1, 7, -7, 8, 11, 12, 15, 16, 64, 127, 128, 500, -128, -500}, at::kLong);
  at::Tensor expected = at::tensor({0, 17, 1, 23, 7, 24, 24, 25, 25, 26, 30, 31, 31, 31, 15, 15}, at::kLong);
  EXPECT_TRUE(test::identical("buckets", t5_relative_position_bucket(rp, 32, 128), expected));
}

TEST(T5Encoder, PositionBiasIsSharedByEveryBlock) {
  T5EncoderModel m(tiny_config());
  nn::fill_random(*m, 5);
  T5EncoderOutput out = m->forward(sample_ids(), /*trace=*/true);
  ASSERT_EQ(out.block_outputs.size(), 2u);
  EXPECT_EQ(out.position_bias.sizes(), (std::vector<int64_t>{1, 2, 20, 20}));
  EXPECT_TRUE(test::identical("position_bias", out.position_bias,
                              m->encoder->blocks[0]->self_attention->SelfAttention->compute_bias(20, 20)));
  // Block 1 applied by hand with block 0's bias reproduces the traced output.
  at::Tensor again = m->encoder->blocks[1]->forward(out.block_outputs[0], out.position_bias);
  EXPECT_TRUE(test::identical("block_1_out", again, out.block_outputs[1]));
}

// transformers' T5Attention, written out as it computes (eager; it has no SDPA implementation):
// scores in the run dtype, the bias added there, softmax in fp32 and cast back, times v. Ours must
// be that arithmetic in bf16 too, on every libtorch (not SDPA's fp32 scores on libtorch >= 2).
TEST(T5Encoder, Bf16AttentionIsTransformersEagerArithmetic) {
  io::T5Config c = tiny_config();
  T5Attention attn(c, /*has_relative_attention_bias=*/true);
  nn::fill_random(*attn, 9);
  attn->to(at::kBFloat16);
  c10::InferenceMode inference;
  at::manual_seed(4);
  const int64_t B = 2, L = 20, H = c.num_heads, Dh = c.d_kv;
  at::Tensor x = at::randn({B, L, c.d_model}).to(at::kBFloat16);
  at::Tensor bias = attn->compute_bias(L, L);
  auto split = [&](const at::Tensor& t) { return t.view({B, L, H, Dh}).transpose(1, 2); };
  at::Tensor q = split(attn->q->forward(x)), k = split(attn->k->forward(x)), v = split(attn->v->forward(x));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) + bias;
  at::Tensor weights = at::softmax(scores.to(at::kFloat), -1).to(scores.scalar_type());
  // v in the layout whose bf16 matmul accumulates in fp32 on libtorch 1.13 (nn::attention's math path).
  at::Tensor vt = v.transpose(-2, -1).contiguous().transpose(-2, -1);
  at::Tensor eager = attn->o->forward(at::matmul(weights, vt).transpose(1, 2).reshape({B, L, H * Dh}));
  EXPECT_TRUE(test::identical("T5 attention (bf16)", attn->forward(x, bias), eager));
}

TEST(T5Encoder, Fp16LoadKeepsWoInFp32ReadFromTheFile) {
  io::T5Config c = tiny_config();
  Written w = write_model(c);
  io::TensorStore store = io::TensorStore::open_file(w.path, "test T5");
  T5EncoderModel m = load_t5_encoder(c, store, at::kHalf, at::kCPU);
  EXPECT_EQ(m->shared->weight.scalar_type(), at::kHalf);
  EXPECT_EQ(m->encoder->blocks[0]->feed_forward->DenseReluDense->wi_0->weight.scalar_type(), at::kHalf);
  at::Tensor wo = m->encoder->blocks[1]->feed_forward->DenseReluDense->wo->weight;
  EXPECT_EQ(wo.scalar_type(), at::kFloat);
  // The fp32 values of the file, not fp16 values widened again.
  EXPECT_TRUE(test::identical("wo", wo, w.source->encoder->blocks[1]->feed_forward->DenseReluDense->wo->weight));
  std::filesystem::remove(w.path);
}

TEST(T5Encoder, Fp16RunStaysFinite) {
  REQUIRE_FP16_DEVICE(device);
  io::T5Config c = tiny_config();
  Written w = write_model(c);
  io::TensorStore store = io::TensorStore::open_file(w.path, "test T5");
  T5EncoderModel m = load_t5_encoder(c, store, at::kHalf, *device);
  T5EncoderOutput out = m->forward(sample_ids());
  EXPECT_EQ(out.last_hidden_state.scalar_type(), at::kHalf);
  EXPECT_TRUE(out.last_hidden_state.isfinite().all().item<bool>());
  std::filesystem::remove(w.path);
}

TEST(T5Encoder, Fp16HiddenStatesAreClampedNotInfinite) {
  // Embeddings near the fp16 maximum plus an attention output of O(1e3): the residual sum
  // overflows fp16, which transformers (and we) clamp so that the rest of the model stays finite.
  io::T5Config c = tiny_config(1);
  T5EncoderModel m(c);
  nn::fill_random(*m, 3);
  {
    at::NoGradGuard no_grad;
    m->shared->weight.fill_(6.5e4);
    m->encoder->blocks[0]->self_attention->SelfAttention->o->weight.mul_(1e3);
  }
  at::Tensor ids = sample_ids();
  const double fp32_peak = m->forward(ids, /*trace=*/true).block_outputs[0].abs().max().item<double>();
  ASSERT_GT(fp32_peak, 65504.0) << "the setup must overflow fp16 for this test to mean anything";
  REQUIRE_FP16_DEVICE(device);
  m->to(*device);
  nn::cast_parameters(*m, at::kHalf);
  T5EncoderOutput out = m->forward(ids, /*trace=*/true);
  EXPECT_TRUE(out.block_outputs[0].isfinite().all().item<bool>());
  EXPECT_LE(out.block_outputs[0].abs().max().item<double>(), 65504.0);
  EXPECT_TRUE(out.last_hidden_state.isfinite().all().item<bool>());
}

TEST(T5Encoder, Fp16ClampRule) {
  at::Tensor finite = at::tensor({1.0, -3.0e4, 6.0e4}, at::kFloat).to(at::kHalf);
  EXPECT_TRUE(test::identical("finite fp16 unchanged", t5_clamp_fp16(finite), finite));
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor overflowed = at::tensor({1.0, inf, -inf, 6.0e4}, at::kFloat).to(at::kHalf);
  // 65504 - 1000 rounds to 64512 in fp16.
  at::Tensor expected = at::tensor({1.0, 64512.0, -64512.0, 6.0e4}, at::kFloat).to(at::kHalf);
  EXPECT_TRUE(test::identical("clamped", t5_clamp_fp16(overflowed), expected));
  at::Tensor fp32 = at::tensor({inf}, at::kFloat);
  EXPECT_TRUE(test::identical("fp32 untouched", t5_clamp_fp16(fp32), fp32));
}

TEST(T5Encoder, TokenIdOutsideTheVocabularyIsAConfigError) {
  T5EncoderModel m(tiny_config());
  nn::fill_random(*m, 1);
  EXPECT_THROW(m->forward(at::tensor({1, 2, 50}, at::kLong).view({1, 3})), ConfigError);
}

}  // namespace
}  // namespace fluxmpi::text_models
