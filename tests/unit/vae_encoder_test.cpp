// The VAE encoder module tree (diffusers names, the (0, 1, 0, 1) downsampling, odd sizes), the
// latent distribution (split, clamp, one batch-wide draw, normalisation), tiled and sliced
// encoding, and its loader (decoder keys skipped, missing or unexpected encoder keys, config
// switches), next to the decoder's loader on the same files.

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "io/model_dir.h"
#include "io/safetensors_writer.h"
#include "models/common/init.h"
#include "models/vae/vae_decoder.h"
#include "models/vae/vae_encoder.h"
#include "support/tensor_compare.h"

namespace fluxmpi::vae {
namespace {
namespace fs = std::filesystem;

// 2 levels: one downsampling (x2).
VaeEncoderConfig small_config(bool quant_conv = false, bool attention = true) {
  VaeEncoderConfig c;
  c.vae.latent_channels = 4;
  c.vae.block_out_channels = {8, 16};
  c.vae.layers_per_block = 1;
  c.vae.norm_num_groups = 4;
  c.vae.mid_block_add_attention = attention;
  c.vae.use_post_quant_conv = false;
  c.use_quant_conv = quant_conv;
  return c;
}

// 4 levels as FLUX.1's VAE (x8), tiny widths.
VaeEncoderConfig four_level_config() {
  VaeEncoderConfig c = small_config();
  c.vae.block_out_channels = {8, 8, 16, 16};
  return c;
}

std::set<std::string> parameter_names(const torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& p : m.named_parameters(true)) names.insert(p.key());
  return names;
}

std::vector<int64_t> dims(const at::Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); }

TEST(VaeEncoder, ParameterNamesAreTheDiffusersKeys) {
  VaeEncoder vae(small_config(/*quant_conv=*/true));
  const std::set<std::string> names = parameter_names(*vae);
  for (const char* key : {"quant_conv.weight", "encoder.conv_in.weight", "encoder.down_blocks.0.resnets.0.norm1.weight",
                          "encoder.down_blocks.0.resnets.0.conv2.bias", "encoder.down_blocks.0.downsamplers.0.conv.weight",
                          "encoder.down_blocks.1.resnets.0.conv_shortcut.weight", "encoder.mid_block.resnets.1.norm2.bias",
                          "encoder.mid_block.attentions.0.group_norm.weight", "encoder.mid_block.attentions.0.to_q.weight",
                          "encoder.mid_block.attentions.0.to_out.0.bias", "encoder.conv_norm_out.weight",
                          "encoder.conv_out.bias"})
    EXPECT_TRUE(names.count(key)) << key;
  // The last level does not downsample; a resnet that keeps its channels has no shortcut conv;
  // layers_per_block resnets per level (the decoder has one more).
  for (const char* key : {"encoder.down_blocks.1.downsamplers.0.conv.weight", "encoder.down_blocks.0.resnets.0.conv_shortcut.weight",
                          "encoder.down_blocks.0.resnets.1.conv1.weight", "post_quant_conv.weight"})
    EXPECT_FALSE(names.count(key)) << key;
  // 2 (quant_conv) + 2 (conv_in) + down block 0 (8 + 2 downsampler) + down block 1 (8 + 2 shortcut)
  // + mid (2 resnets x 8, attention 10) + 2 (conv_norm_out) + 2 (conv_out).
  EXPECT_EQ(names.size(), 2u + 2 + 10 + 10 + 26 + 2 + 2);
  auto params = vae->named_parameters();
  EXPECT_EQ(dims(params["encoder.conv_in.weight"]), (std::vector<int64_t>{8, 3, 3, 3}));
  EXPECT_EQ(dims(params["encoder.down_blocks.0.downsamplers.0.conv.weight"]), (std::vector<int64_t>{8, 8, 3, 3}));
  EXPECT_EQ(dims(params["encoder.down_blocks.1.resnets.0.conv_shortcut.weight"]), (std::vector<int64_t>{16, 8, 1, 1}));
  EXPECT_EQ(dims(params["encoder.conv_out.weight"]), (std::vector<int64_t>{8, 16, 3, 3}));  // 2 x latent_channels
  EXPECT_EQ(dims(params["quant_conv.weight"]), (std::vector<int64_t>{8, 8, 1, 1}));

  VaeEncoder plain(small_config(/*quant_conv=*/false, /*attention=*/false));
  for (const auto& name : parameter_names(*plain)) {
    EXPECT_EQ(name.find("attentions"), std::string::npos) << name;
    EXPECT_EQ(name.find("quant_conv"), std::string::npos) << name;
  }
}

// Each downsampling floors a side to half (pad one zero row/column, 3x3 stride 2): 40x56 -> 5x7
// through 4 levels, as the vae_encode fixture; odd sides lose their last row.
TEST(VaeEncoder, ShapesForOddSizes) {
  VaeEncoder vae(four_level_config());
  nn::fill_random(*vae, 41);
  EncoderTrace trace;
  LatentDistribution d = vae->encode(at::rand({2, 3, 40, 56}) * 2 - 1, &trace);
  EXPECT_EQ(dims(d.mean), (std::vector<int64_t>{2, 4, 5, 7}));
  EXPECT_EQ(dims(trace.conv_in), (std::vector<int64_t>{2, 8, 40, 56}));
  ASSERT_EQ(trace.down_blocks.size(), 4u);
  EXPECT_EQ(dims(trace.down_blocks[0]), (std::vector<int64_t>{2, 8, 20, 28}));
  EXPECT_EQ(dims(trace.down_blocks[1]), (std::vector<int64_t>{2, 8, 10, 14}));
  EXPECT_EQ(dims(trace.down_blocks[2]), (std::vector<int64_t>{2, 16, 5, 7}));
  EXPECT_EQ(dims(trace.down_blocks[3]), (std::vector<int64_t>{2, 16, 5, 7}));  // no downsampler
  EXPECT_EQ(dims(trace.mid_block), (std::vector<int64_t>{2, 16, 5, 7}));
  EXPECT_EQ(dims(trace.conv_norm_out), (std::vector<int64_t>{2, 16, 5, 7}));
  EXPECT_EQ(dims(vae->moments(at::zeros({1, 3, 41, 57}))), (std::vector<int64_t>{1, 8, 5, 7}));
  EXPECT_EQ(dims(vae->moments(at::zeros({1, 3, 13, 15}))), (std::vector<int64_t>{1, 8, 1, 1}));  // 6x7, 3x3, 1x1
  EXPECT_TRUE(d.mean.isfinite().all().item<bool>());
  EXPECT_THROW(vae->encode(at::zeros({1, 4, 16, 16})), InternalError);  // 4 channels, the config says 3
  EXPECT_THROW(vae->encode(at::zeros({1, 3, 4, 4})), InternalError);    // 4 -> 2 -> 1: too small to downsample
}

// With a kernel that reads only tap (ky, kx), output (i, j) is input (2i + ky, 2j + kx), or the zero
// padding past the bottom/right edge: nothing is padded above or to the left.
TEST(VaeDownsample2D, PadsOnlyTheBottomAndRight) {
  Downsample2D down(1);
  auto params = down->named_parameters();
  at::NoGradGuard no_grad;
  params["conv.bias"].zero_();
  const at::Tensor x = at::arange(1, 37, at::kFloat).view({1, 1, 6, 6});  // no zeros inside
  for (int64_t ky : {0, 2}) {
    params["conv.weight"].zero_();
    params["conv.weight"][0][0][ky][ky].fill_(1.0);
    const at::Tensor y = down->forward(x);
    ASSERT_EQ(dims(y), (std::vector<int64_t>{1, 1, 3, 3}));
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        const int64_t r = 2 * i + ky, c = 2 * j + ky;
        const float want = r < 6 && c < 6 ? x[0][0][r][c].item<float>() : 0.0f;
        EXPECT_EQ(y[0][0][i][j].item<float>(), want) << "tap " << ky << ", output (" << i << ", " << j << ")";
      }
  }
}

TEST(VaeLatentDistribution, SplitsClampsAndSamplesInOneDraw) {
  // Channels 0, 1: mean; 2, 3: logvar, with values beyond both clamp bounds.
  at::Tensor moments = at::randn({2, 4, 3, 5});
  moments.narrow(1, 2, 1).fill_(-50.0);
  moments.narrow(1, 3, 1).fill_(25.0);
  const LatentDistribution d = latent_distribution(moments);
  EXPECT_TRUE(test::identical("mean", d.mean, moments.narrow(1, 0, 2)));
  EXPECT_EQ(d.logvar.narrow(1, 0, 1).min().item<float>(), -30.0f);
  EXPECT_EQ(d.logvar.narrow(1, 1, 1).max().item<float>(), 20.0f);
  EXPECT_TRUE(test::identical("std", d.std, at::exp(0.5 * at::clamp(moments.narrow(1, 2, 2), -30.0, 20.0))));
  EXPECT_TRUE(test::identical("mode", d.mode(), d.mean));

  // One randn of the whole [2, 2, 3, 5] from the generator, then the next draw continues from it.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t{7});
  const at::Tensor first = d.sample(gen);
  const at::Tensor second = d.sample(gen);
  at::Generator ref_gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t{7});
  const at::Tensor draw = at::randn({2, 2, 3, 5}, ref_gen);
  EXPECT_TRUE(test::identical("sample", first, d.mean + d.std * draw));
  EXPECT_TRUE(test::identical("second sample", second, d.mean + d.std * at::randn({2, 2, 3, 5}, ref_gen)));
  EXPECT_FALSE(test::identical("two samples", first, second));
}

TEST(VaeEncoder, NormalizeSubtractsTheShiftThenScales) {
  VaeEncoderConfig c = small_config();
  c.vae.shift_factor = 0.1159;
  c.vae.scaling_factor = 0.3611;
  VaeEncoder vae(c);
  const at::Tensor z = at::randn({1, 4, 3, 3});
  EXPECT_TRUE(test::identical("normalize", vae->normalize(z), (z - 0.1159) * 0.3611));
}

TEST(VaeEncoder, QuantConvRunsAfterTheEncoderAndBatchItemsAreIndependent) {
  VaeEncoder with(small_config(/*quant_conv=*/true));
  nn::fill_random(*with, 42);
  VaeEncoder without(small_config(/*quant_conv=*/false));
  {
    at::NoGradGuard no_grad;
    auto source = with->named_parameters();
    for (auto& p : without->named_parameters()) p.value().set_data(source[p.key()].clone());
  }
  const at::Tensor x = at::rand({2, 3, 8, 10}) * 2 - 1;
  auto params = with->named_parameters();
  const at::Tensor projected = at::conv2d(without->moments(x), params["quant_conv.weight"], params["quant_conv.bias"]);
  EXPECT_TRUE(test::close_to("moments with quant_conv", with->moments(x), projected, 0.0));
  EXPECT_TRUE(test::close_to("image 1 alone", with->moments(x.narrow(0, 1, 1)), with->moments(x).narrow(0, 1, 1),
                             test::kTolFp32));
}

// diffusers' encode-side tile geometry for the FLUX.1 VAE (sample_size 1024, 4 levels): 1024-pixel
// tiles every 768 pixels, 32 latent cells blended, 96 kept per tile.
TEST(VaeEncodeTiling, FluxGeometryIsDiffusersDefault) {
  io::VaeConfig flux;
  flux.block_out_channels = {128, 256, 512, 512};
  flux.sample_size = 1024;
  const EncodeTiles t{tile_geometry(flux)};
  EXPECT_EQ(t.sample_stride(), 768);
  EXPECT_EQ(t.blend_extent(), 32);
  EXPECT_EQ(t.row_limit(), 96);
  EXPECT_FALSE(t.applies(1024, 1024));  // one tile: encoded untiled, as diffusers does
  EXPECT_TRUE(t.applies(1024, 1040));
  EXPECT_EQ(t.tile_count(2048, 2048), 9);
  EXPECT_EQ(t.tile_count(1024, 1024), 1);
}

// diffusers' _tiled_encode as it is written: every tile's moments first, then blended in place in
// row-major order (each tile with the already blended one above and to its left), then cropped.
at::Tensor reference_tiled_moments(VaeEncoder& vae, const at::Tensor& x, const EncodeTiles& t) {
  const int64_t tile = t.geometry.sample_tile, stride = t.sample_stride();
  std::vector<std::vector<at::Tensor>> grid;
  for (int64_t i = 0; i < x.size(2); i += stride) {
    grid.emplace_back();
    for (int64_t j = 0; j < x.size(3); j += stride)
      grid.back().push_back(vae->moments(x.slice(2, i, i + tile).slice(3, j, j + tile).contiguous()).clone());
  }
  auto blend = [](const at::Tensor& a, at::Tensor& b, int64_t extent, int64_t dim) {
    const int64_t e = std::min({a.size(dim), b.size(dim), extent});
    for (int64_t y = 0; y < e; ++y) {
      const double w = static_cast<double>(y) / static_cast<double>(e);
      b.select(dim, y).copy_(a.select(dim, a.size(dim) - e + y) * (1 - w) + b.select(dim, y) * w);
    }
  };
  std::vector<at::Tensor> rows;
  for (size_t i = 0; i < grid.size(); ++i) {
    std::vector<at::Tensor> row;
    for (size_t j = 0; j < grid[i].size(); ++j) {
      if (i > 0) blend(grid[i - 1][j], grid[i][j], t.blend_extent(), 2);
      if (j > 0) blend(grid[i][j - 1], grid[i][j], t.blend_extent(), 3);
      row.push_back(grid[i][j].slice(2, 0, t.row_limit()).slice(3, 0, t.row_limit()));
    }
    rows.push_back(at::cat(row, 3));
  }
  return at::cat(rows, 2);
}

TEST(VaeEncodeTiling, SmallImageIsUntiledLargeImageIsBlendedAndSlicingChangesNothing) {
  VaeEncoderConfig c = small_config();
  c.vae.sample_size = 16;  // 2 levels: 16-pixel tiles every 12 pixels, 8-cell moments, 2 blended, 6 kept
  VaeEncoder vae(c);
  nn::fill_random(*vae, 43);
  const EncodeTiles t{tile_geometry(c.vae)};
  ASSERT_EQ(t.sample_stride(), 12);
  ASSERT_EQ(t.blend_extent(), 2);
  ASSERT_EQ(t.row_limit(), 6);
  const EncodeOptions tiled{/*tiling=*/true, /*slicing=*/false};

  // No side above one tile: the very same computation as an untiled encode.
  const at::Tensor small = at::rand({2, 3, 16, 12}) * 2 - 1;
  const LatentDistribution untiled_small = vae->encode(small);
  const LatentDistribution tiled_small = vae->encode(small, tiled);
  EXPECT_TRUE(test::identical("mean of an image within one tile, tiled", tiled_small.mean, untiled_small.mean));
  EXPECT_TRUE(test::identical("std of an image within one tile, tiled", tiled_small.std, untiled_small.std));

  // 28 x 40: 3 x 4 tiles (the last row and column 4 pixels wide), moments 6 + 6 + 2 by 6 + 6 + 6 + 2.
  const at::Tensor x = at::rand({2, 3, 28, 40}) * 2 - 1;
  ASSERT_EQ(t.tile_count(28, 40), 12);
  const at::Tensor moments = encode_moments([&](const at::Tensor& p) { return vae->moments(p); }, x, t, tiled);
  const at::Tensor whole = vae->moments(x);
  ASSERT_EQ(dims(moments), dims(whole));
  EXPECT_TRUE(test::close_to("tiled moments vs diffusers' loop", moments, reference_tiled_moments(vae, x, t), 0.0));
  // The top-left tile's kept cells are its own encode, before any blending.
  const at::Tensor first = vae->moments(x.slice(2, 0, 16).slice(3, 0, 16).contiguous());
  EXPECT_TRUE(test::identical("top-left tile", moments.slice(2, 0, 6).slice(3, 0, 6), first.slice(2, 0, 6).slice(3, 0, 6)));
  EXPECT_FALSE(test::identical("tiled vs whole", moments, whole));
  // The distribution is formed from the blended moments.
  const LatentDistribution d = vae->encode(x, tiled);
  EXPECT_TRUE(test::identical("tiled mean", d.mean, moments.narrow(1, 0, 4)));
  EXPECT_TRUE(test::identical("tiled logvar", d.logvar, at::clamp(moments.narrow(1, 4, 4), -30.0, 20.0)));

  const LatentDistribution sliced = vae->encode(x, EncodeOptions{true, true});
  EXPECT_TRUE(test::close_to("sliced tiles vs batched tiles", sliced.mean, d.mean, test::kTolFp32));
  EXPECT_TRUE(test::identical("sliced untiled image 1 vs encoded alone", vae->encode(x, EncodeOptions{false, true}).mean[1],
                              vae->encode(x.narrow(0, 1, 1)).mean[0]));
}

// A diffusers pipeline folder holding only what the VAE loaders read: the encoder's and the
// decoder's tensors in one file, as diffusers saves AutoencoderKL.
class VaeEncoderLoaderTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("fluxmpi-vae-encoder-" + std::to_string(::getpid()));
    fs::create_directories(root_ / "vae");
    std::ofstream(root_ / "model_index.json") << R"({"_class_name": "FluxPipeline"})";
  }
  void TearDown() override { fs::remove_all(root_); }

  void write_config(bool quant_conv, bool attention = true, const std::string& down_type = "DownEncoderBlock2D") {
    std::ofstream(root_ / "vae" / "config.json")
        << R"({"_class_name": "AutoencoderKL", "latent_channels": 4, "block_out_channels": [8, 16],)"
        << R"( "layers_per_block": 1, "norm_num_groups": 4, "scaling_factor": 0.5, "shift_factor": 0.1,)"
        << R"( "down_block_types": [")" << down_type << R"(", "DownEncoderBlock2D"],)"
        << R"( "use_post_quant_conv": false, "use_quant_conv": )" << (quant_conv ? "true" : "false")
        << R"(, "mid_block_add_attention": )" << (attention ? "true" : "false") << "}";
  }
  // The parameters of `encoder` and of a decoder of the same config, but `drop`, plus `extra`.
  void write_weights(const VaeEncoder& encoder, io::DType dtype, const std::vector<std::string>& extra = {},
                     const std::string& drop = "") {
    io::VaeConfig dc = encoder->config().vae;
    VaeDecoder decoder(dc);
    nn::fill_random(*decoder, 99);
    io::SafetensorsWriter w;
    for (const torch::nn::Module* m : {static_cast<const torch::nn::Module*>(encoder.get()),
                                       static_cast<const torch::nn::Module*>(decoder.get())})
      for (const auto& p : m->named_parameters(true)) {
        if (p.key() == drop) continue;
        at::Tensor t = p.value().to(dtype == io::DType::BF16 ? at::kBFloat16 : at::kFloat).contiguous();
        w.add(p.key(), dtype, dims(t), t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
      }
    std::vector<float> zeros(8 * 4, 0.0f);
    for (const auto& key : extra) w.add(key, io::DType::F32, {8, 4}, zeros.data(), zeros.size() * 4);
    w.write((root_ / "vae" / "diffusion_pytorch_model.safetensors").string());
  }
  template <typename E>
  std::string load_error() {
    try {
      load_vae_encoder(io::ModelDir(root_.string()), at::kFloat, at::kCPU);
    } catch (const E& e) {
      return e.what();
    }
    return "";
  }

  fs::path root_;
};

TEST_F(VaeEncoderLoaderTest, EncoderAndDecoderLoadFromTheSameFileAndBf16Upcasts) {
  VaeEncoder source(small_config(/*quant_conv=*/true));
  nn::fill_random(*source, 51);
  write_config(/*quant_conv=*/true);
  write_weights(source, io::DType::BF16);
  const io::ModelDir model(root_.string());
  EXPECT_NO_THROW(check_vae_encoder_weights(model));
  VaeEncoder loaded = load_vae_encoder(model, at::kFloat, at::kCPU);
  EXPECT_EQ(loaded->dtype(), at::kFloat);
  EXPECT_TRUE(loaded->config().use_quant_conv);
  EXPECT_DOUBLE_EQ(loaded->config().vae.shift_factor, 0.1);
  auto want = source->named_parameters();
  for (const auto& p : loaded->named_parameters())
    ASSERT_TRUE(test::identical(p.key(), p.value(), want[p.key()].to(at::kBFloat16).to(at::kFloat)));
  // The decoder skips every encoder tensor (quant_conv included) of the same file.
  EXPECT_NO_THROW(check_vae_weights(model));
  VaeDecoder decoder = load_vae_decoder(model, at::kFloat, at::kCPU);
  EXPECT_EQ(parameter_names(*decoder).count("decoder.conv_in.weight"), 1u);
  EXPECT_EQ(load_vae_encoder(model, at::kBFloat16, at::kCPU)->dtype(), at::kBFloat16);
}

TEST_F(VaeEncoderLoaderTest, MissingEncoderTensorIsAnErrorNamingTheKey) {
  VaeEncoder source(small_config());
  nn::fill_random(*source, 52);
  write_config(false);
  write_weights(source, io::DType::F32, {}, /*drop=*/"encoder.down_blocks.0.downsamplers.0.conv.weight");
  const std::string msg = load_error<WeightError>();
  EXPECT_NE(msg.find("tensor 'encoder.down_blocks.0.downsamplers.0.conv.weight' not found (expected shape [8, 8, 3, 3])"),
            std::string::npos)
      << msg;
  EXPECT_THROW(check_vae_encoder_weights(io::ModelDir(root_.string())), WeightError);
  // The decoder does not need the encoder's tensors.
  EXPECT_NO_THROW(load_vae_decoder(io::ModelDir(root_.string()), at::kFloat, at::kCPU));
}

TEST_F(VaeEncoderLoaderTest, UnexpectedEncoderTensorIsAnError) {
  VaeEncoder source(small_config());
  nn::fill_random(*source, 53);
  write_config(false);
  write_weights(source, io::DType::F32, {"encoder.down_blocks.0.extra.weight"});
  const std::string msg = load_error<WeightError>();
  EXPECT_NE(msg.find("unexpected tensor 'encoder.down_blocks.0.extra.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model dir '" + root_.string() + "': vae"), std::string::npos) << msg;
}

TEST_F(VaeEncoderLoaderTest, QuantConvSwitchMustMatchTheWeights) {
  VaeEncoder without(small_config(/*quant_conv=*/false));
  nn::fill_random(*without, 54);
  write_config(/*quant_conv=*/true);
  write_weights(without, io::DType::F32);
  std::string msg = load_error<ConfigError>();
  EXPECT_NE(msg.find("vae/config.json: 'use_quant_conv' is true"), std::string::npos) << msg;
  EXPECT_NE(msg.find("have no 'quant_conv.weight'"), std::string::npos) << msg;

  VaeEncoder with(small_config(/*quant_conv=*/true));
  nn::fill_random(*with, 55);
  write_config(/*quant_conv=*/false);
  write_weights(with, io::DType::F32);
  msg = load_error<ConfigError>();
  EXPECT_NE(msg.find("'use_quant_conv' is false"), std::string::npos) << msg;
}

TEST_F(VaeEncoderLoaderTest, MidBlockAttentionSwitchMustMatchTheWeights) {
  VaeEncoder source(small_config(false, /*attention=*/true));
  nn::fill_random(*source, 56);
  write_config(false, /*attention=*/false);
  write_weights(source, io::DType::F32);
  // The encoder names its own attention tensor.
  const std::string msg = load_error<ConfigError>();
  EXPECT_NE(msg.find("'mid_block_add_attention' is false"), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.mid_block.attentions.0.to_q.weight"), std::string::npos) << msg;
}

TEST_F(VaeEncoderLoaderTest, OtherDownBlockTypesAreAConfigError) {
  VaeEncoder source(small_config());
  nn::fill_random(*source, 57);
  write_config(false, true, "AttnDownEncoderBlock2D");
  write_weights(source, io::DType::F32);
  const std::string msg = load_error<ConfigError>();
  EXPECT_NE(msg.find("'down_block_types' entries must be \"DownEncoderBlock2D\", got \"AttnDownEncoderBlock2D\""),
            std::string::npos)
      << msg;
}

TEST_F(VaeEncoderLoaderTest, LdmEncoderNamesAreReportedAsSuch) {
  VaeEncoder source(small_config());
  nn::fill_random(*source, 58);
  write_config(false);
  write_weights(source, io::DType::F32, {"encoder.down.0.block.0.conv1.weight"});
  const std::string msg = load_error<WeightError>();
  EXPECT_NE(msg.find("LDM names ('encoder.down.0.block.0.conv1.weight')"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fluxmpi::vae
