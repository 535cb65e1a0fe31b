// The VAE decoder module tree (names, shapes, post_quant_conv) and its loader (skipped encoder
// keys, config switches that disagree with the weights, unexpected and missing tensors).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "io/model_dir.h"
#include "io/safetensors_writer.h"
#include "models/common/attention.h"
#include "models/common/init.h"
#include "models/vae/vae_decoder.h"
#include "support/tensor_compare.h"

namespace fluxmpi::vae {
namespace {
namespace fs = std::filesystem;

io::VaeConfig small_config(bool post_quant_conv = false, bool attention = true) {
  io::VaeConfig c;
  c.latent_channels = 4;
  c.block_out_channels = {8, 16};
  c.layers_per_block = 1;
  c.norm_num_groups = 4;
  c.use_post_quant_conv = post_quant_conv;
  c.mid_block_add_attention = attention;
  return c;
}

std::set<std::string> parameter_names(const torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& p : m.named_parameters(true)) names.insert(p.key());
  return names;
}

TEST(VaeDecoder, ParameterNamesAreTheDiffusersKeys) {
  VaeDecoder vae(small_config(/*post_quant_conv=*/true));
  const std::set<std::string> names = parameter_names(*vae);
  for (const char* key : {"post_quant_conv.weight", "decoder.conv_in.weight", "decoder.mid_block.resnets.0.norm1.weight",
                          "decoder.mid_block.resnets.1.conv2.bias", "decoder.mid_block.attentions.0.group_norm.weight",
                          "decoder.mid_block.attentions.0.to_q.weight", "decoder.mid_block.attentions.0.to_out.0.bias",
                          "decoder.up_blocks.0.resnets.1.conv1.weight", "decoder.up_blocks.0.upsamplers.0.conv.weight",
                          "decoder.up_blocks.1.resnets.0.conv_shortcut.weight", "decoder.conv_norm_out.weight",
                          "decoder.conv_out.bias"})
    EXPECT_TRUE(names.count(key)) << key;
  // The last level does not upsample; a resnet that keeps its channels has no shortcut conv;
  // layers_per_block + 1 resnets per level.
  for (const char* key : {"decoder.up_blocks.1.upsamplers.0.conv.weight", "decoder.up_blocks.0.resnets.0.conv_shortcut.weight",
                          "decoder.up_blocks.0.resnets.2.conv1.weight"})
    EXPECT_FALSE(names.count(key)) << key;
  // 2 (post_quant_conv) + 2 (conv_in) + mid (2 resnets x 8, attention 10) + up block 0 (2 x 8 + 2)
  // + up block 1 (8 + 2 shortcut + 8) + 2 (conv_norm_out) + 2 (conv_out).
  EXPECT_EQ(names.size(), 2u + 2 + 26 + 18 + 18 + 2 + 2);
  EXPECT_EQ(vae->named_parameters()["decoder.up_blocks.1.resnets.0.conv_shortcut.weight"].sizes(),
            (std::vector<int64_t>{8, 16, 1, 1}));
  EXPECT_EQ(vae->named_parameters()["decoder.conv_in.weight"].sizes(), (std::vector<int64_t>{16, 4, 3, 3}));

  VaeDecoder plain(small_config(/*post_quant_conv=*/false, /*attention=*/false));
  for (const auto& name : parameter_names(*plain)) {
    EXPECT_EQ(name.find("attentions"), std::string::npos) << name;
    EXPECT_EQ(name.find("post_quant_conv"), std::string::npos) << name;
  }
}

TEST(VaeDecoder, ShapesAndTrace) {
  VaeDecoder vae(small_config());
  nn::fill_random(*vae, 11);
  DecoderTrace trace;
  at::Tensor out = vae->forward(at::randn({2, 4, 3, 5}), &trace);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 6, 10}));
  EXPECT_EQ(trace.conv_in.sizes(), (std::vector<int64_t>{2, 16, 3, 5}));
  EXPECT_EQ(trace.mid_block.sizes(), (std::vector<int64_t>{2, 16, 3, 5}));
  ASSERT_EQ(trace.up_blocks.size(), 2u);
  EXPECT_EQ(trace.up_blocks[0].sizes(), (std::vector<int64_t>{2, 16, 6, 10}));
  EXPECT_EQ(trace.up_blocks[1].sizes(), (std::vector<int64_t>{2, 8, 6, 10}));
  EXPECT_EQ(trace.conv_norm_out.sizes(), (std::vector<int64_t>{2, 8, 6, 10}));
  EXPECT_TRUE(out.isfinite().all().item<bool>());
  EXPECT_THROW(vae->forward(at::randn({2, 5, 3, 5})), InternalError);  // wrong latent channels
}

TEST(VaeDecoder, BatchItemsAreIndependent) {
  VaeDecoder vae(small_config());
  nn::fill_random(*vae, 12);
  at::Tensor z = at::randn({2, 4, 4, 4});
  at::Tensor both = vae->forward(z);
  EXPECT_TRUE(test::close_to("image 1 alone", vae->forward(z.narrow(0, 1, 1)), both.narrow(0, 1, 1), test::kTolFp32));
}

// diffusers' tile geometry for the FLUX.1 VAE (sample_size 1024, 4 levels): 128-cell latent tiles
// every 96 cells, 256 pixels blended, 768 kept per tile.
TEST(VaeTiling, FluxGeometryIsDiffusersDefault) {
  io::VaeConfig flux;
  flux.block_out_channels = {128, 256, 512, 512};
  flux.sample_size = 1024;
  const TileGeometry g = tile_geometry(flux);
  EXPECT_EQ(g.sample_tile, 1024);
  EXPECT_EQ(g.latent_tile, 128);
  EXPECT_EQ(g.latent_stride(), 96);
  EXPECT_EQ(g.blend_extent(), 256);
  EXPECT_EQ(g.row_limit(), 768);
  EXPECT_FALSE(g.applies(128, 128));  // 1024 x 1024: one tile, decoded untiled as diffusers does
  EXPECT_TRUE(g.applies(128, 129));
  EXPECT_EQ(g.tile_count(256, 256), 9);  // 2048 x 2048
  EXPECT_EQ(g.tile_count(128, 128), 1);
}

TEST(VaeTiling, TiledOutputHasTheImageSizeAndSlicingChangesNothing) {
  io::VaeConfig c = small_config();
  c.sample_size = 8;  // 2 levels: 4-cell latent tiles every 3 cells, 2 pixels blended
  VaeDecoder vae(c);
  nn::fill_random(*vae, 13);
  const at::Tensor z = at::randn({2, 4, 7, 10});
  const at::Tensor whole = vae->decode(z, DecodeOptions{});
  const at::Tensor tiled = vae->decode(z, DecodeOptions{/*tiling=*/true, /*slicing=*/false});
  ASSERT_EQ(tiled.sizes(), whole.sizes());
  // The top-left tile's first rows and columns are its own decode, before any blending.
  const at::Tensor first = vae->forward(z.slice(2, 0, 4).slice(3, 0, 4));
  EXPECT_TRUE(test::identical("top-left corner of the tiled image", tiled.slice(2, 0, 6).slice(3, 0, 6)[0],
                              first.slice(2, 0, 6).slice(3, 0, 6)[0]));
  EXPECT_FALSE(test::identical("tiled vs whole", tiled, whole));
  const at::Tensor sliced = vae->decode(z, DecodeOptions{true, true});
  EXPECT_TRUE(test::close_to("sliced tiles vs batched tiles", sliced, tiled, test::kTolFp32));
  EXPECT_TRUE(test::identical("sliced untiled image 1 vs decoded alone", vae->decode(z, DecodeOptions{false, true})[1],
                              vae->forward(z.narrow(0, 1, 1))[0]));
}

TEST(VaeDecoder, PostQuantConvRunsBeforeTheDecoder) {
  VaeDecoder with(small_config(/*post_quant_conv=*/true));
  nn::fill_random(*with, 13);
  VaeDecoder without(small_config(/*post_quant_conv=*/false));
  {
    at::NoGradGuard no_grad;
    auto source = with->named_parameters();
    for (auto& p : without->named_parameters()) p.value().set_data(source[p.key()].clone());
  }
  at::Tensor z = at::randn({1, 4, 3, 3});
  auto params = with->named_parameters();
  at::Tensor projected = at::conv2d(z, params["post_quant_conv.weight"], params["post_quant_conv.bias"]);
  EXPECT_TRUE(test::close_to("decode with post_quant_conv", with->forward(z), without->forward(projected), 0.0));
}

// The attention written out once more, whole: softmax(q k^T / sqrt(C)) v over the pixels of each
// image, with GroupNorm before and the residual after.
at::Tensor reference_attention(torch::nn::Module& m, const at::Tensor& x, int64_t groups) {
  auto p = m.named_parameters();
  const int64_t B = x.size(0), C = x.size(1);
  at::Tensor t = at::group_norm(x, groups, p["group_norm.weight"], p["group_norm.bias"], 1e-6).flatten(2).transpose(1, 2);
  at::Tensor q = at::linear(t, p["to_q.weight"], p["to_q.bias"]);
  at::Tensor k = at::linear(t, p["to_k.weight"], p["to_k.bias"]);
  at::Tensor v = at::linear(t, p["to_v.weight"], p["to_v.bias"]);
  at::Tensor w = at::softmax(at::bmm(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(C)), -1);
  at::Tensor o = at::linear(at::bmm(w, v), p["to_out.0.weight"], p["to_out.0.bias"]);
  return o.transpose(1, 2).reshape(x.sizes()) + x;
}

TEST(VaeMidBlockAttention, MatchesTheFormulaWholeAndInQueryChunks) {
  const int64_t C = 8, groups = 4;
  MidBlockAttention attention(C, groups);
  nn::fill_random(*attention, 31);
  at::NoGradGuard no_grad;
  {
    at::Tensor x = at::randn({2, C, 5, 7});
    EXPECT_TRUE(test::close_to("attention, 35 pixels", attention->forward(x), reference_attention(*attention, x, groups),
                               test::kTolFp32));
  }
  // 96 x 96 = 9216 pixels: a 340 MB score matrix, above nn::kAttentionChunkBytes, so the queries
  // run in chunks.
  const int64_t side = 96;
  ASSERT_GT(side * side * side * side * 4, nn::kAttentionChunkBytes);
  at::Tensor x = at::randn({1, C, side, side});
  EXPECT_TRUE(test::close_to("attention, 9216 pixels in query chunks", attention->forward(x),
                             reference_attention(*attention, x, groups), test::kTolFp32));
}

// A diffusers pipeline folder holding only what the VAE loader reads.
class VaeLoaderTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("fluxmpi-vae-" + std::to_string(::getpid()));
    fs::create_directories(root_ / "vae");
    std::ofstream(root_ / "model_index.json") << R"({"_class_name": "FluxPipeline"})";
  }
  void TearDown() override { fs::remove_all(root_); }

  void write_config(bool post_quant_conv, bool attention = true) {
    std::ofstream(root_ / "vae" / "config.json")
        << R"({"_class_name": "AutoencoderKL", "latent_channels": 4, "block_out_channels": [8, 16],)"
        << R"( "layers_per_block": 1, "norm_num_groups": 4, "scaling_factor": 0.5, "shift_factor": 0.1,)"
        << R"( "use_post_quant_conv": )" << (post_quant_conv ? "true" : "false")
        << R"(, "mid_block_add_attention": )" << (attention ? "true" : "false") << "}";
  }
  // Weights of `source` plus encoder-side tensors (which the loader must skip) and `extra`.
  void write_weights(const VaeDecoder& source, io::DType dtype, const std::vector<std::string>& extra = {},
                     const std::string& drop = "") {
    io::SafetensorsWriter w;
    for (const auto& p : source->named_parameters(true)) {
      if (p.key() == drop) continue;
      at::Tensor t = p.value().to(dtype == io::DType::BF16 ? at::kBFloat16 : at::kFloat).contiguous();
      w.add(p.key(), dtype, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr(),
            static_cast<size_t>(t.numel() * t.element_size()));
    }
    std::vector<float> zeros(8 * 4, 0.0f);
    for (std::string key : {"encoder.conv_in.weight", "quant_conv.weight"})
      w.add(key, io::DType::F32, {8, 4}, zeros.data(), zeros.size() * 4);
    for (const auto& key : extra) w.add(key, io::DType::F32, {8, 4}, zeros.data(), zeros.size() * 4);
    w.write((root_ / "vae" / "diffusion_pytorch_model.safetensors").string());
  }
  template <typename E>
  std::string load_error() {
    try {
      load_vae_decoder(io::ModelDir(root_.string()), at::kFloat, at::kCPU);
    } catch (const E& e) {
      return e.what();
    }
    return "";
  }

  fs::path root_;
};

TEST_F(VaeLoaderTest, LoadsSkippingEncoderTensorsAndUpcastsBf16) {
  VaeDecoder source(small_config(/*post_quant_conv=*/true));
  nn::fill_random(*source, 21);
  write_config(true);
  write_weights(source, io::DType::BF16);
  VaeDecoder loaded = load_vae_decoder(io::ModelDir(root_.string()), at::kFloat, at::kCPU);
  EXPECT_EQ(loaded->dtype(), at::kFloat);
  EXPECT_DOUBLE_EQ(loaded->config().shift_factor, 0.1);
  auto want = source->named_parameters();
  for (const auto& p : loaded->named_parameters())
    ASSERT_TRUE(test::identical(p.key(), p.value(), want[p.key()].to(at::kBFloat16).to(at::kFloat)));
}

TEST_F(VaeLoaderTest, PostQuantConvInConfigRequiresItsWeights) {
  VaeDecoder source(small_config(/*post_quant_conv=*/false));
  nn::fill_random(*source, 22);
  write_config(/*post_quant_conv=*/true);
  write_weights(source, io::DType::F32);
  const std::string msg = load_error<ConfigError>();
  EXPECT_NE(msg.find("vae/config.json: 'use_post_quant_conv' is true"), std::string::npos) << msg;
  EXPECT_NE(msg.find("have no 'post_quant_conv.weight'"), std::string::npos) << msg;
}

TEST_F(VaeLoaderTest, PostQuantConvWeightsWithoutTheConfigSwitchAreAnError) {
  VaeDecoder source(small_config(/*post_quant_conv=*/true));
  nn::fill_random(*source, 23);
  write_config(/*post_quant_conv=*/false);
  write_weights(source, io::DType::F32);
  const std::string msg = load_error<ConfigError>();
  EXPECT_NE(msg.find("'use_post_quant_conv' is false"), std::string::npos) << msg;
}

TEST_F(VaeLoaderTest, MidBlockAttentionSwitchMustMatchTheWeights) {
  VaeDecoder source(small_config(false, /*attention=*/true));
  nn::fill_random(*source, 24);
  write_config(false, /*attention=*/false);
  write_weights(source, io::DType::F32);
  const std::string msg = load_error<ConfigError>();
  EXPECT_NE(msg.find("'mid_block_add_attention' is false"), std::string::npos) << msg;
}

TEST_F(VaeLoaderTest, UnexpectedTensorIsAnError) {
  VaeDecoder source(small_config());
  nn::fill_random(*source, 25);
  write_config(false);
  write_weights(source, io::DType::F32, {"decoder.up_blocks.0.extra.weight"});
  const std::string msg = load_error<WeightError>();
  EXPECT_NE(msg.find("unexpected tensor 'decoder.up_blocks.0.extra.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model dir '" + root_.string() + "': vae"), std::string::npos) << msg;
}

TEST_F(VaeLoaderTest, MissingTensorAndWrongShapeAreErrors) {
  VaeDecoder source(small_config());
  nn::fill_random(*source, 26);
  write_config(false);
  write_weights(source, io::DType::F32, {}, /*drop=*/"decoder.conv_out.bias");
  std::string msg = load_error<WeightError>();
  EXPECT_NE(msg.find("tensor 'decoder.conv_out.bias' not found (expected shape [3])"), std::string::npos) << msg;

  io::VaeConfig wide = small_config();
  wide.block_out_channels = {8, 24};
  VaeDecoder other(wide);
  nn::fill_random(*other, 27);
  write_weights(other, io::DType::F32);
  msg = load_error<WeightError>();
  EXPECT_NE(msg.find("tensor 'decoder.conv_in.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has shape [24, 4, 3, 3], expected [16, 4, 3, 3]"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fluxmpi::vae
