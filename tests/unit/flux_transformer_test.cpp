// The transformer split into parts: any contiguous slice of blocks with global names, loading only
// its keys, and a chain of parts computing bit for bit what the whole model computes.

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_dir.h"
#include "models/common/init.h"
#include "models/flux/latents.h"
#include "models/common/tensor_utils.h"
#include "models/flux/transformer.h"
#include "support/tensor_compare.h"

namespace fluxmpi::flux {
namespace {
namespace fs = std::filesystem;

io::TransformerConfig tiny_config() {
  io::TransformerConfig c;
  c.num_layers = 2;
  c.num_single_layers = 3;
  c.attention_head_dim = 16;
  c.num_attention_heads = 2;
  c.joint_attention_dim = 24;
  c.pooled_projection_dim = 20;
  c.guidance_embeds = true;
  c.axes_dims_rope = {4, 6, 6};
  return c;
}

class FluxParts : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fluxmpi-flux-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "model_index.json") << R"({"_class_name": "FluxPipeline"})";
    config_ = tiny_config();
    whole_ = FluxTransformer(config_, TransformerPart::whole(config_));
    nn::fill_random(*whole_, 11);
    nn::save_component((dir_ / "transformer").string(), io::to_json(config_), *whole_, "diffusion_pytorch_model",
                       io::DType::F32, 3);
  }
  void TearDown() override { fs::remove_all(dir_); }

  TransformerInputs inputs(int64_t B, int64_t S, int64_t h, int64_t w) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
    TransformerInputs in;
    in.latents = at::randn({B, (h / 2) * (w / 2), config_.in_channels}, gen);
    in.text = at::randn({B, S, config_.joint_attention_dim}, gen);
    in.pooled = at::randn({B, config_.pooled_projection_dim}, gen);
    in.timestep = at::full({B}, 0.75f);
    in.guidance = at::full({B}, 3.5f);
    return in;
  }

  fs::path dir_;
  io::TransformerConfig config_;
  FluxTransformer whole_{nullptr};
};

// Runs a chain of parts like the ranks of a pipeline do.
at::Tensor run_chain(const std::vector<FluxTransformer>& parts, const TransformerInputs& in, const at::Tensor& txt_ids,
                     const at::Tensor& img_ids) {
  StreamState s = parts.front()->embed(in);
  for (const auto& p : parts) p->run_blocks(s, p->rope(txt_ids, img_ids));
  return parts.back()->final_layer(s);
}

TEST_F(FluxParts, ChainsOfPartsMatchTheWholeModelBitForBit) {
  c10::InferenceMode guard;
  io::ModelDir dir(dir_.string());
  auto in = inputs(1, 7, 6, 8);
  at::Tensor txt_ids = text_position_ids(7), img_ids = image_position_ids(6, 8);
  FluxTransformer whole = load_flux_transformer(dir, TransformerPart::whole(config_), at::kFloat, at::kCPU);
  at::Tensor expected = whole->forward(in, txt_ids, img_ids);
  // Cuts inside the double blocks, at the double/single boundary, inside the single blocks, and
  // a three-way split.
  const std::vector<std::vector<int64_t>> cuts = {{1}, {2}, {3}, {4}, {1, 3}, {2, 4}};
  for (const auto& cut : cuts) {
    std::vector<int64_t> bounds = {0};
    bounds.insert(bounds.end(), cut.begin(), cut.end());
    bounds.push_back(config_.num_blocks());
    std::vector<FluxTransformer> parts;
    std::string label;
    for (size_t r = 0; r + 1 < bounds.size(); ++r) {
      TransformerPart p{bounds[r], bounds[r + 1], r == 0, r + 2 == bounds.size()};
      parts.push_back(load_flux_transformer(dir, p, at::kFloat, at::kCPU));
      label += "[" + std::to_string(bounds[r]) + "," + std::to_string(bounds[r + 1]) + ")";
    }
    EXPECT_TRUE(test::identical("parts " + label, run_chain(parts, in, txt_ids, img_ids), expected));
  }
  // Fusing projections must not change the result beyond round-off.
  at::Tensor unfused = whole_->forward(in, txt_ids, img_ids);
  EXPECT_TRUE(test::close_to("fused vs unfused", expected, unfused, test::kTolFp32));
}

TEST_F(FluxParts, PartsHoldOnlyTheirBlocksUnderGlobalNames) {
  TransformerPart middle{1, 4, false, false};  // double 1, single 0-1
  FluxTransformer part(config_, middle);
  std::vector<std::string> names;
  for (const auto& p : part->named_parameters()) names.push_back(p.key());
  auto has_prefix = [&](const std::string& prefix) {
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
  };
  EXPECT_TRUE(has_prefix("transformer_blocks.1.attn.to_q."));
  EXPECT_TRUE(has_prefix("single_transformer_blocks.1.proj_mlp."));
  EXPECT_FALSE(has_prefix("transformer_blocks.0."));
  EXPECT_FALSE(has_prefix("single_transformer_blocks.2."));
  EXPECT_FALSE(has_prefix("x_embedder."));
  EXPECT_FALSE(has_prefix("norm_out."));
  EXPECT_TRUE(part->owns_key("single_transformer_blocks.0.norm.linear.weight"));
  EXPECT_FALSE(part->owns_key("single_transformer_blocks.2.norm.linear.weight"));
  EXPECT_FALSE(part->owns_key("proj_out.weight"));
  EXPECT_FALSE(part->owns_key("some.unknown.key")) << "unknown keys are rank 0's to report";
}

TEST_F(FluxParts, UnclaimedKeyInTheOwnedRangeIsAnError) {
  // Add a stray tensor to the shard that holds transformer_blocks.1.
  io::ModelDir dir(dir_.string());
  io::TensorStore store = dir.open_weights("transformer");
  const std::string shard = store.file_of("transformer_blocks.1.attn.to_q.weight");
  store.close();
  io::SafetensorsWriter w;
  {
    io::SafetensorsFile f((dir_ / "transformer" / shard).string());
    for (const auto& e : f.header().tensors) w.add(e.name, e.dtype, e.shape, f.data(e), e.num_bytes());
  }
  std::vector<float> stray(4, 0.f);
  w.add("transformer_blocks.1.attn.stray", io::DType::F32, {4}, stray.data(), 16);
  w.write((dir_ / "transformer" / shard).string());
  // The index must list it too (else it is "stored in a shard the index does not name").
  std::ifstream in(dir_ / "transformer" / "diffusion_pytorch_model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  index["weight_map"]["transformer_blocks.1.attn.stray"] = shard;
  std::ofstream(dir_ / "transformer" / "diffusion_pytorch_model.safetensors.index.json") << index.dump();

  io::ModelDir dir2(dir_.string());
  try {
    load_flux_transformer(dir2, TransformerPart{1, 2, false, false}, at::kFloat, at::kCPU);
    FAIL() << "stray key in the owned range accepted";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected tensor 'transformer_blocks.1.attn.stray'"), std::string::npos) << e.what();
  }
  // A part that does not own block 1 ignores it.
  EXPECT_NO_THROW(load_flux_transformer(dir2, TransformerPart{2, 5, false, true}, at::kFloat, at::kCPU));
}

TEST_F(FluxParts, ConfigThatDisagreesWithTheWeights) {
  io::TransformerConfig wrong = config_;
  wrong.num_layers = 3;  // the weights hold 2 double blocks
  std::ofstream(dir_ / "transformer" / "config.json") << io::to_json(wrong);
  io::ModelDir dir(dir_.string());
  io::TensorStore store = dir.open_weights("transformer");
  try {
    dir.check_transformer_weights(store);
    FAIL() << "num_layers mismatch accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("transformer/config.json: 'num_layers' is 3 but the weights hold 2"), std::string::npos)
        << e.what();
  }
  wrong = config_;
  wrong.joint_attention_dim = 32;
  std::ofstream(dir_ / "transformer" / "config.json") << io::to_json(wrong);
  io::ModelDir dir2(dir_.string());
  EXPECT_THROW(dir2.check_transformer_weights(store), ConfigError);
}

TEST_F(FluxParts, ReducedPrecisionRunsStayCloseToFp32) {
  c10::InferenceMode guard;
  io::ModelDir dir(dir_.string());
  auto in = inputs(2, 5, 4, 4);
  // diffusers casts the timestep to the run dtype before x1000: values exact in 16 bits keep the
  // comparison about the network, not about timestep rounding (0.75 * 1000 is 752 in bf16).
  in.timestep = at::full({2}, 0.5f);
  in.guidance = at::full({2}, 4.0f);
  at::Tensor txt_ids = text_position_ids(5), img_ids = image_position_ids(4, 4);
  at::Tensor ref = load_flux_transformer(dir, TransformerPart::whole(config_), at::kFloat, at::kCPU)
                       ->forward(in, txt_ids, img_ids);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    if (!nn::dtype_supported(dtype, at::kCPU)) {
      // Debian's libtorch 1.13 has no fp16 matmul on CPU: the probe must say so.
      EXPECT_EQ(dtype, at::kHalf) << "bf16 matmuls must be available on CPU";
      continue;
    }
    FluxTransformer m = load_flux_transformer(dir, TransformerPart::whole(config_), dtype, at::kCPU);
    TransformerInputs low = in;
    low.latents = in.latents.to(dtype);
    low.text = in.text.to(dtype);
    low.pooled = in.pooled.to(dtype);
    low.timestep = in.timestep.to(dtype);
    at::Tensor out = m->forward(low, txt_ids, img_ids);
    EXPECT_EQ(out.scalar_type(), dtype);
    EXPECT_TRUE(test::close_to(std::string("output in ") + nn::dtype_label(dtype), out, ref, test::kTolBf16Sanity));
  }
}

}  // namespace
}  // namespace fluxmpi::flux
