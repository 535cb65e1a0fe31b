// LoRA files and their merge, without fixtures: --lora FILE[:SCALE] parsing, the two key layouts
// and the errors of a file of neither (each naming the file and the key), alpha in every stored
// dtype, the merge W + scale * alpha / r * up[rows] @ down against a float64 computation, and the
// loader hook rounding the merged fp32 weight once to the run dtype.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "io/lora_file.h"
#include "io/safetensors_writer.h"
#include "models/common/layers.h"
#include "models/common/loader.h"
#include "models/common/lora.h"
#include "support/tensor_compare.h"

namespace fluxmpi::nn {
namespace {

// The test files live in one folder, removed when the program ends.
const std::filesystem::path& temp_dir() {
  static const struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("fluxmpi-lora-test-" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } dir;
  return dir.path;
}

std::string temp_path(const std::string& name) { return (temp_dir() / name).string(); }

void add(io::SafetensorsWriter& w, const std::string& key, const at::Tensor& value, io::DType dtype = io::DType::F32) {
  at::ScalarType st = dtype == io::DType::BF16 ? at::kBFloat16 : dtype == io::DType::F16 ? at::kHalf : at::kFloat;
  at::Tensor t = value.to(st).contiguous();
  w.add(key, dtype, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr(),
        static_cast<size_t>(t.numel() * t.element_size()));
}

std::string write(const io::SafetensorsWriter& w, const std::string& name) {
  const std::string path = temp_path(name);
  w.write(path);
  return path;
}

// The WeightError message of opening `path`, or "" when it opens.
std::string open_error(const std::string& path) {
  try {
    io::LoraFile f({path, 1.0});
  } catch (const WeightError& e) {
    return e.what();
  }
  return "";
}

TEST(LoraSpec, FileAndOptionalScale) {
  EXPECT_EQ(io::parse_lora_spec("a.safetensors"), (io::LoraSpec{"a.safetensors", 1.0}));
  EXPECT_EQ(io::parse_lora_spec("a.safetensors:0.8"), (io::LoraSpec{"a.safetensors", 0.8}));
  EXPECT_EQ(io::parse_lora_spec("a.safetensors:-1.5"), (io::LoraSpec{"a.safetensors", -1.5}));
  // A ':' that is not followed by a number belongs to the file name.
  EXPECT_EQ(io::parse_lora_spec("run:3/a.safetensors"), (io::LoraSpec{"run:3/a.safetensors", 1.0}));
  EXPECT_THROW(io::parse_lora_spec("a.safetensors:inf"), UsageError);
  EXPECT_THROW(io::parse_lora_spec(":0.5"), UsageError);
  EXPECT_THROW(io::parse_lora_spec(""), UsageError);
  EXPECT_EQ(io::lora_spec_text({"/x/a.safetensors", 0.1}), "/x/a.safetensors:0.1");
  const std::vector<io::LoraSpec> two = {{"/x/a.safetensors", 0.5}, {"/y/b.safetensors", 1.0}};
  EXPECT_EQ(io::loras_from_json(io::loras_to_json(two)), two);
  EXPECT_FALSE(io::loras_from_json("{\"file\": 1}").has_value());
}

TEST(LoraFile, GroupsBothLayoutsIntoPairs) {
  io::SafetensorsWriter d;
  add(d, "transformer.proj_out.lora_A.weight", at::ones({2, 8}));
  add(d, "transformer.proj_out.lora_B.weight", at::ones({4, 2}));
  add(d, "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight", at::ones({3, 8}));
  add(d, "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_B.weight", at::ones({8, 3}));
  add(d, "text_encoder_2.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight", at::ones({1, 8}));
  add(d, "text_encoder_2.encoder.block.0.layer.0.SelfAttention.q.lora_B.weight", at::ones({8, 1}));
  io::LoraFile df({write(d, "layouts-d.safetensors"), 2.0});
  EXPECT_EQ(df.layout(), io::LoraLayout::Diffusers);
  ASSERT_EQ(df.pairs().size(), 3u);
  for (const auto& p : df.pairs()) {
    if (p.target == io::LoraTarget::Transformer) {
      EXPECT_EQ(p.module, "proj_out");
      EXPECT_EQ(df.alpha(p), 2.0) << "no alpha: alpha = r";
      EXPECT_EQ(df.factor(p), 2.0);
    }
    if (p.target == io::LoraTarget::T5) EXPECT_EQ(p.module, "encoder.block.0.layer.0.SelfAttention.q");
  }

  io::SafetensorsWriter k;
  add(k, "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", at::ones({4, 8}), io::DType::BF16);
  add(k, "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", at::ones({24, 4}), io::DType::BF16);
  add(k, "lora_unet_double_blocks_0_img_attn_qkv.alpha", at::full({}, 2.0), io::DType::BF16);
  add(k, "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight", at::ones({4, 8}), io::DType::F16);
  add(k, "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_up.weight", at::ones({16, 4}), io::DType::F16);
  add(k, "lora_te1_text_model_encoder_layers_0_mlp_fc1.alpha", at::full({}, 0.375), io::DType::F16);
  add(k, "lora_te2_encoder_block_0_layer_1_DenseReluDense_wo.lora_down.weight", at::ones({2, 8}));
  add(k, "lora_te2_encoder_block_0_layer_1_DenseReluDense_wo.lora_up.weight", at::ones({8, 2}));
  add(k, "lora_te2_encoder_block_0_layer_1_DenseReluDense_wo.alpha", at::full({}, 3.0));
  io::LoraFile kf({write(k, "layouts-k.safetensors"), 0.8});
  EXPECT_EQ(kf.layout(), io::LoraLayout::Kohya);
  ASSERT_EQ(kf.pairs().size(), 3u);
  for (const auto& p : kf.pairs()) {
    if (p.target == io::LoraTarget::Transformer) {
      EXPECT_EQ(p.module, "double_blocks_0_img_attn_qkv");
      EXPECT_EQ(kf.alpha(p), 2.0) << "bf16 alpha";
      EXPECT_DOUBLE_EQ(kf.factor(p), 0.8 * 2.0 / 4.0);
    } else if (p.target == io::LoraTarget::Clip) {
      EXPECT_EQ(kf.alpha(p), 0.375) << "fp16 alpha";
    } else {
      EXPECT_EQ(kf.alpha(p), 3.0) << "fp32 alpha";
      EXPECT_EQ(p.module, "encoder_block_0_layer_1_DenseReluDense_wo");
    }
  }
}

TEST(LoraFile, RejectsFilesOfNeitherLayoutNamingFileAndKey) {
  auto one = [](const std::string& name, const std::function<void(io::SafetensorsWriter&)>& fill) {
    io::SafetensorsWriter w;
    fill(w);
    return write(w, name);
  };
  std::string p = one("neither.safetensors", [](auto& w) { add(w, "transformer.proj_out.weight", at::ones({4, 8})); });
  EXPECT_NE(open_error(p).find("LoRA '" + p + "': 'transformer.proj_out.weight' is not a LoRA key of either layout"),
            std::string::npos) << open_error(p);
  p = one("noprefix.safetensors", [](auto& w) {
    add(w, "unet.proj_out.lora_A.weight", at::ones({2, 8}));
    add(w, "unet.proj_out.lora_B.weight", at::ones({4, 2}));
  });
  EXPECT_NE(open_error(p).find("'unet.proj_out.lora_A.weight' names no model"), std::string::npos) << open_error(p);
  p = one("mixed.safetensors", [](auto& w) {
    add(w, "lora_unet_img_in.lora_down.weight", at::ones({2, 8}));
    add(w, "lora_unet_img_in.lora_up.weight", at::ones({4, 2}));
    add(w, "transformer.proj_out.lora_A.weight", at::ones({2, 8}));
    add(w, "transformer.proj_out.lora_B.weight", at::ones({4, 2}));
  });
  EXPECT_NE(open_error(p).find("a file holds one layout"), std::string::npos) << open_error(p);
  p = one("noup.safetensors", [](auto& w) { add(w, "transformer.proj_out.lora_A.weight", at::ones({2, 8})); });
  EXPECT_NE(open_error(p).find("'transformer.proj_out.lora_A.weight' has no 'transformer.proj_out.lora_B.weight'"),
            std::string::npos) << open_error(p);
  p = one("rank.safetensors", [](auto& w) {
    add(w, "transformer.proj_out.lora_A.weight", at::ones({2, 8}));
    add(w, "transformer.proj_out.lora_B.weight", at::ones({4, 3}));
  });
  EXPECT_NE(open_error(p).find("has rank 2"), std::string::npos) << open_error(p);
  p = one("dtype.safetensors", [](auto& w) {
    const std::vector<int32_t> v(16, 1);
    w.add("transformer.proj_out.lora_A.weight", io::DType::I32, {2, 8}, v.data(), v.size() * 4);
  });
  EXPECT_NE(open_error(p).find("has dtype I32; LoRA tensors must be F32, F16 or BF16"), std::string::npos) << open_error(p);
  p = one("empty.safetensors", [](auto&) {});
  EXPECT_NE(open_error(p).find("holds no LoRA tensors"), std::string::npos) << open_error(p);
}

// A fused module (rows 0..5 of up land on "a", rows 6..9 on "b" from its row 2) merged against float64.
TEST(LoraMerge, FusedRowsAndStackingMatchAFloat64Merge) {
  at::manual_seed(3);
  const at::Tensor down1 = at::randn({3, 5}), up1 = at::randn({10, 3});
  const at::Tensor down2 = at::randn({2, 5}), up2 = at::randn({6, 2});
  io::SafetensorsWriter k;
  add(k, "lora_unet_fused.lora_down.weight", down1);
  add(k, "lora_unet_fused.lora_up.weight", up1);
  add(k, "lora_unet_fused.alpha", at::full({}, 1.5));
  io::SafetensorsWriter d;
  add(d, "transformer.a.lora_A.weight", down2);
  add(d, "transformer.a.lora_B.weight", up2);
  auto kf = std::make_shared<const io::LoraFile>(io::LoraSpec{write(k, "fused.safetensors"), 0.7});
  auto df = std::make_shared<const io::LoraFile>(io::LoraSpec{write(d, "plain.safetensors"), -0.25});
  const WeightShapes shapes = {{"a", {6, 5}}, {"b", {7, 5}}};
  KohyaResolver fused = [](const std::string& name) -> std::vector<LoraRows> {
    if (name != "fused") return {};
    return {{"a", 0, 6, 0}, {"b", 6, 10, 2}};
  };
  LoraSet set({kf, df}, io::LoraTarget::Transformer, shapes, fused);
  ASSERT_EQ(set.updates().size(), 3u);
  EXPECT_EQ(set.count({}), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(set.count([](const std::string& m) { return m == "b"; }), (std::vector<int64_t>{1, 0}));

  at::Tensor a = at::randn({6, 5}), b = at::randn({7, 5});
  auto applied = std::make_shared<std::vector<int64_t>>();
  WeightAdjust adjust = set.adjust(applied);
  ASSERT_TRUE(adjust.wants("a.weight") && adjust.wants("b.weight"));
  EXPECT_FALSE(adjust.wants("a.bias"));
  at::Tensor ma = a.clone(), mb = b.clone();
  adjust.apply("a.weight", ma);
  adjust.apply("b.weight", mb);
  EXPECT_EQ(*applied, (std::vector<int64_t>{2, 1}));

  auto D = [](const at::Tensor& t) { return t.to(at::kDouble); };
  const at::Tensor delta1 = D(up1).mm(D(down1)) * (0.7 * 1.5 / 3);
  const at::Tensor want_a = D(a) + delta1.narrow(0, 0, 6) + D(up2).mm(D(down2)) * (-0.25 * 2 / 2);
  at::Tensor want_b = D(b).clone();
  want_b.narrow(0, 2, 4) += delta1.narrow(0, 6, 4);
  EXPECT_TRUE(test::close_to("a after both LoRAs", ma, want_a.to(at::kFloat), test::kTolFp32));
  EXPECT_TRUE(test::close_to("b after the fused rows", mb, want_b.to(at::kFloat), test::kTolFp32));
  EXPECT_TRUE(test::identical("rows of b no LoRA changes", mb.narrow(0, 0, 2), b.narrow(0, 0, 2)));
}

TEST(LoraMerge, ShapeErrorsNameFileAndKey) {
  io::SafetensorsWriter d;
  add(d, "transformer.a.lora_A.weight", at::ones({2, 4}));
  add(d, "transformer.a.lora_B.weight", at::ones({6, 2}));
  auto f = std::make_shared<const io::LoraFile>(io::LoraSpec{write(d, "shape.safetensors"), 1.0});
  try {
    LoraSet({f}, io::LoraTarget::Transformer, {{"a", {6, 5}}}, {});
    FAIL() << "no error for an update [6, 2] x [2, 4] on a [6, 5] weight";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("'transformer.a.lora_A.weight' has shape [2, 4], but 'a.weight' is [6, 5]"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(f->path()), std::string::npos) << e.what();
  }
  try {
    LoraSet({f}, io::LoraTarget::Transformer, {{"b", {6, 4}}}, {});
    FAIL() << "no error for a module the model does not have";
  } catch (const WeightError& e) {
    EXPECT_NE(std::string(e.what()).find("names no module of the transformer"), std::string::npos) << e.what();
  }
}

// The loader merges in fp32 and rounds once: a bf16 run holds exactly bf16(W + delta).
TEST(LoraMerge, LoaderRoundsTheMergedWeightOnceToTheRunDtype) {
  at::manual_seed(5);
  Linear lin(6, 4);
  const at::Tensor w = at::randn({4, 6}), bias = at::randn({4});
  io::SafetensorsWriter base;
  add(base, "weight", w);
  add(base, "bias", bias);
  const std::string base_path = write(base, "base.safetensors");
  const at::Tensor down = at::randn({2, 6}), up = at::randn({4, 2});
  io::SafetensorsWriter d;
  add(d, "transformer.lin.lora_A.weight", down);
  add(d, "transformer.lin.lora_B.weight", up);
  add(d, "transformer.lin.alpha", at::full({}, 1.0));
  auto f = std::make_shared<const io::LoraFile>(io::LoraSpec{write(d, "round.safetensors"), 0.5});
  LoraSet set({f}, io::LoraTarget::Transformer, {{"lin", {4, 6}}}, {});
  // The module's keys are "weight" / "bias": the set's "lin.weight" is renamed onto them.
  WeightAdjust inner = set.adjust();
  LoadRules rules;
  rules.adjust.applies = [](const std::string& key) { return key == "weight"; };
  rules.adjust.apply = [&](const std::string&, at::Tensor& t) { inner.apply("lin.weight", t); };
  io::TensorStore store = io::TensorStore::open_file(base_path, "base");
  load_module(*lin, store, rules, at::kBFloat16, at::kCPU);
  const at::Tensor merged = at::addmm(w, up, down, /*beta=*/1, /*alpha=*/0.5 * 1.0 / 2.0);
  EXPECT_TRUE(test::identical("bf16 weight = bf16(fp32 merge)", lin->weight, merged.to(at::kBFloat16)));
  EXPECT_TRUE(test::identical("bias untouched", lin->bias, bias.to(at::kBFloat16)));
}

}  // namespace
}  // namespace fluxmpi::nn
