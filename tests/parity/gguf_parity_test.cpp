// GGUF transformers against diffusers 0.40 (project subtree tests/fixtures/gguf, made by
// tools/fixtures/gguf_fixtures.py): every transformer_forward case (a tiny FLUX.1-dev and a tiny
// FLUX.2 [dev] in the original key layout, each quantized tensor in another of the ten block types)
// loaded from the GGUF file through the single-file key maps, its output against diffusers'
// GGUFQuantizationConfig(compute_dtype=float32) run at the tolerance the manifest allows (above the
// reference's own float64 distance, at most 1e-4 relative); the quantized linears kept quantized
// (parameter bytes about the file's); the forward split in two parts bit-identical to the whole;
// the panel-by-panel product against one dequantized GEMM; the weights dequantized into bf16
// bit-identical to torch's cast of the float32 ones; a bf16 run within the bf16 sanity bound of
// diffusers' bf16 run of the same file.

#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <filesystem>

#include "io/gguf.h"
#include "io/json_config.h"
#include "io/single_file.h"
#include "models/common/layers.h"
#include "models/common/quantized_linear.h"
#include "models/flux/transformer.h"
#include "models/flux2/transformer.h"
#include "support/subtree_cases.h"
#include "support/tensor_compare.h"

namespace fluxmpi {
namespace {
namespace fs = std::filesystem;
using test::SubtreeCase;

std::vector<SubtreeCase> gguf_cases() {
  return test::project_subtree_cases("gguf", [](const std::string& kind) { return kind == "transformer_forward"; });
}

bool is_flux2(const SubtreeCase& c) { return c.json.at("call").at("class").get<std::string>() == "Flux2Transformer2DModel"; }

std::string config_path(const SubtreeCase& c) { return (fs::path(c.model_dir) / "transformer" / "config.json").string(); }
std::string gguf_path(const SubtreeCase& c) { return (fs::path(c.model_dir) / "transformer.gguf").string(); }

// The tolerance: 10x the reference's distance to float64, at least 1e-5, at most 1e-4.
double tolerance(const SubtreeCase& c) {
  const double d = c.json.at("float64_distance").at("noise_pred").get<double>();
  return std::min(1e-4, std::max(test::kTolFp32, 10 * d));
}

io::TensorStore open_store(const SubtreeCase& c, const io::TransformerConfig* flux1, const io::Flux2TransformerConfig* flux2) {
  auto file = io::open_weight_file(gguf_path(c));
  const auto found = io::detect_components(file->header());
  EXPECT_EQ(found.size(), 1u);
  io::LayoutConfigs configs;
  configs.transformer = flux1;
  configs.flux2 = flux2;
  configs.transformer_label = config_path(c);
  return io::open_component(file, found.at(0), configs, "transformer file '" + gguf_path(c) + "'");
}

struct Model {
  std::shared_ptr<flux::StageModel> stage;
  std::shared_ptr<torch::nn::Module> module;
  int64_t blocks = 0;
};

Model load(const SubtreeCase& c, flux::TransformerPart part, at::ScalarType dtype, int64_t* blocks_out = nullptr) {
  Model m;
  if (is_flux2(c)) {
    const io::Flux2TransformerConfig config =
        io::parse_flux2_transformer_config(io::ConfigReader::from_file(config_path(c), config_path(c)));
    if (part.end_block < 0) part.end_block = config.num_blocks();
    flux2::Flux2Transformer t = flux2::load_flux2_transformer(config, open_store(c, nullptr, &config), part, dtype, at::kCPU);
    m.stage = t.ptr();
    m.module = t.ptr();
    m.blocks = config.num_blocks();
  } else {
    const io::TransformerConfig config = io::parse_transformer_config(io::ConfigReader::from_file(config_path(c), config_path(c)));
    if (part.end_block < 0) part.end_block = config.num_blocks();
    flux::FluxTransformer t(config, part);
    nn::LoadRules rules;
    rules.owned = [&t](const std::string& key) { return t->owns_key(key); };
    nn::load_module(*t, open_store(c, &config, nullptr), rules, dtype, at::kCPU);
    t->fuse_projections();
    m.stage = t.ptr();
    m.module = t.ptr();
    m.blocks = config.num_blocks();
  }
  if (blocks_out) *blocks_out = m.blocks;
  return m;
}

at::Tensor forward(const Model& first, const Model* second, const test::CaseTensors& ref, at::ScalarType dtype) {
  flux::TransformerInputs in;
  in.latents = ref.get("hidden_states").to(dtype);
  in.text = ref.get("encoder_hidden_states").to(dtype);
  if (ref.has("pooled_projections")) in.pooled = ref.get("pooled_projections").to(dtype);
  in.timestep = ref.get("timestep");
  in.guidance = ref.get("guidance");
  flux::StreamState s = first.stage->embed(in);
  const flux::RopeTables rope = first.stage->rope(ref.get("txt_ids"), ref.get("img_ids"));
  first.stage->run_blocks(s, rope);
  const Model& last = second ? *second : first;
  if (second) second->stage->run_blocks(s, rope);
  return last.stage->final_layer(s).to(at::kFloat);
}

class GgufForward : public testing::TestWithParam<SubtreeCase> {};

TEST_P(GgufForward, MatchesDiffusersGgufRun) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "gguf");
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const Model whole = load(c, flux::TransformerPart{0, -1, true, true}, at::kFloat);
  const at::Tensor out = forward(whole, nullptr, ref, at::kFloat);
  EXPECT_TRUE(test::close_to(c.name + ": noise_pred", out, ref.get("noise_pred"), tolerance(c)));

  // The quantized linears stayed quantized: the model holds about the file's bytes, not fp32 weights.
  int64_t quantized = 0, dense_bytes = 0;
  for (const auto& m : whole.module->modules())
    if (auto* l = dynamic_cast<nn::LinearImpl*>(m.get()); l && l->quantized) {
      ++quantized;
      dense_bytes += l->in_features * l->out_features * 4;
    }
  const int64_t held = nn::parameter_bytes(*whole.module);
  const int64_t file = static_cast<int64_t>(fs::file_size(gguf_path(c)));
  EXPECT_GT(quantized, 10) << c.name;
  EXPECT_LT(held, file + file / 2) << c.name << ": the model holds " << held << " bytes for a file of " << file;
  std::cout << "[ measured ] " << c.name << ": " << quantized << " quantized linears, the model holds " << held
            << " bytes (the GGUF file " << file << ", its quantized weights in fp32 " << dense_bytes << ")\n";
}

TEST_P(GgufForward, TwoPartsAreTheWhole) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "gguf");
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  int64_t blocks = 0;
  const Model whole = load(c, flux::TransformerPart{0, -1, true, true}, at::kFloat, &blocks);
  const Model a = load(c, flux::TransformerPart{0, 1, true, false}, at::kFloat);
  const Model b = load(c, flux::TransformerPart{1, blocks, false, true}, at::kFloat);
  test::expect_identical(c.name + ": two parts", forward(a, &b, ref, at::kFloat), forward(whole, nullptr, ref, at::kFloat));
}

TEST_P(GgufForward, PanelsAgainstOneDequantizedProduct) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "gguf");
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const Model whole = load(c, flux::TransformerPart{0, -1, true, true}, at::kFloat);
  const at::Tensor panels = forward(whole, nullptr, ref, at::kFloat);
  nn::set_quantized_panels(false);
  const at::Tensor once = forward(whole, nullptr, ref, at::kFloat);
  nn::set_quantized_panels(true);
  EXPECT_TRUE(test::close_to(c.name + ": panels vs one product", panels, once, test::kTolFp32));
  EXPECT_TRUE(test::close_to(c.name + ": one product vs diffusers", once, ref.get("noise_pred"), tolerance(c)));
}

// A bf16 run dequantizes straight into bf16: the same bits as torch's cast of the float32
// dequantization (diffusers' fp16 weight cast to the compute dtype), for every quantized linear.
TEST_P(GgufForward, Bf16WeightsAreTheCastOfTheFloatOnes) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "gguf");
  c10::InferenceMode guard;
  const Model whole = load(c, flux::TransformerPart{0, -1, true, true}, at::kBFloat16);
  int64_t checked = 0, elements = 0;
  for (const auto& m : whole.module->modules())
    if (auto* l = dynamic_cast<nn::LinearImpl*>(m.get()); l && l->quantized) {
      const at::Tensor direct = l->quantized->dequantize(at::kBFloat16);
      const at::Tensor cast = l->quantized->dequantize(at::kFloat).to(at::kBFloat16);
      ASSERT_EQ(direct.scalar_type(), at::kBFloat16);
      EXPECT_TRUE(direct.view(at::kShort).equal(cast.view(at::kShort)))
          << c.name << ": a " << l->quantized->dtype_text() << " weight [" << l->out_features << ", " << l->in_features
          << "] dequantized into bf16 differs from the cast of its float32 dequantization";
      ++checked;
      elements += direct.numel();
    }
  EXPECT_GT(checked, 10) << c.name;
  std::cout << "[ measured ] " << c.name << ": " << checked << " quantized weights (" << elements
            << " values) bit-identical in bf16 to the cast of float32\n";
}

TEST_P(GgufForward, Bf16WithinTheSanityBound) {
  const SubtreeCase& c = GetParam();
  REQUIRE_PROJECT_CASE(c, "gguf");
  c10::InferenceMode guard;
  test::CaseTensors ref(c.file);
  const Model whole = load(c, flux::TransformerPart{0, -1, true, true}, at::kBFloat16);
  const at::Tensor panels = forward(whole, nullptr, ref, at::kBFloat16);
  nn::set_quantized_panels(false);
  const at::Tensor once = forward(whole, nullptr, ref, at::kBFloat16);
  nn::set_quantized_panels(true);
  EXPECT_TRUE(test::close_to(c.name + ": bf16 panels vs once", panels, once, test::kTolBf16Sanity));
  // diffusers' own bf16 run of the file (this random tiny FLUX.1 is far from its fp32 output in bf16:
  // the manifest's bf16_distance_to_float64, 0.41; ours is compared with diffusers' bf16 run).
  EXPECT_TRUE(test::close_to(c.name + ": bf16 noise_pred", panels, ref.get("noise_pred_bf16"), test::kTolBf16Sanity));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufForward, testing::ValuesIn(gguf_cases()),
                         [](const testing::TestParamInfo<SubtreeCase>& info) {
                           std::string n = info.param.name.empty() ? "none" : info.param.name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace fluxmpi
