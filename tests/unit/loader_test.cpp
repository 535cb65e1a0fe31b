// The generic loader: names, shapes, dtype conversion, tied weights, unclaimed keys.

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "io/float8.h"
#include "io/safetensors_writer.h"
#include "models/common/init.h"
#include "models/common/layers.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "support/tensor_compare.h"

namespace fluxmpi::nn {
namespace {

class TwoLayers : public torch::nn::Module {
 public:
  TwoLayers(int64_t w) {
    first = register_module("first", Linear(w, 2 * w));
    norm = register_module("norm", RMSNorm(2 * w, 1e-6));
  }
  Linear first{nullptr};
  RMSNorm norm{nullptr};
};

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("fluxmpi-loader-" + std::to_string(::getpid()) + "-" + name)).string();
}

// The message of load_module on `w` ("" when it loads). check_module, which reads headers only,
// must report exactly the same.
std::string load_error(const io::SafetensorsWriter& w, const LoadRules& rules = {}) {
  std::string path = temp_file("bad.safetensors");
  w.write(path);
  auto error_of = [&](bool load) -> std::string {
    TwoLayers m(4);
    try {
      auto store = io::TensorStore::open_file(path, "test");
      if (load) load_module(m, store, rules, at::kFloat, at::kCPU);
      else check_module(m, store, rules);
    } catch (const WeightError& e) {
      return e.what();
    }
    return "";
  };
  std::string loaded = error_of(true), checked = error_of(false);
  std::filesystem::remove(path);
  EXPECT_EQ(checked, loaded) << "check_module and load_module disagree";
  return loaded;
}

TEST(Loader, RoundTripsAndConvertsDtype) {
  TwoLayers src(4);
  fill_random(src, 7);
  io::SafetensorsWriter w;
  add_parameters(w, src, "", io::DType::F32);
  std::string path = temp_file("ok.safetensors");
  w.write(path);
  auto store = io::TensorStore::open_file(path, "test");
  TwoLayers dst(4);
  LoadStats stats = load_module(dst, store, {}, at::kBFloat16, at::kCPU);
  EXPECT_EQ(stats.tensors, 3);
  EXPECT_EQ(stats.bytes, (8 * 4 + 8 + 8) * 2);
  EXPECT_EQ(dst.first->weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(test::identical("first.weight", dst.first->weight, src.first->weight.to(at::kBFloat16)));
  std::filesystem::remove(path);
}

TEST(Loader, ReportsMissingWrongShapeAndUnclaimedKeys) {
  TwoLayers src(4);
  fill_random(src, 1);
  {
    io::SafetensorsWriter w;  // norm.weight missing
    for (const auto& p : src.named_parameters())
      if (p.key() != "norm.weight") {
        at::Tensor t = p.value().contiguous();
        w.add(p.key(), io::DType::F32, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr(), t.numel() * 4);
      }
    EXPECT_EQ(load_error(w), "test: tensor 'norm.weight' not found (expected shape [8])");
  }
  {
    io::SafetensorsWriter w;
    add_parameters(w, src, "", io::DType::F32);
    std::vector<float> extra(3, 0.f);
    w.add("first.extra", io::DType::F32, {3}, extra.data(), 12);
    std::string msg = load_error(w);
    EXPECT_NE(msg.find("unexpected tensor 'first.extra'"), std::string::npos) << msg;
    LoadRules only_norm;
    only_norm.owned = [](const std::string& k) { return k.rfind("norm.", 0) == 0; };
    EXPECT_EQ(load_error(w, only_norm), "") << "keys outside the owned range must be ignored";
  }
  {
    TwoLayers wide(5);
    fill_random(wide, 2);
    io::SafetensorsWriter w;
    add_parameters(w, wide, "", io::DType::F32);
    std::string msg = load_error(w);
    EXPECT_NE(msg.find("tensor 'first.weight' in '"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has shape [10, 5], expected [8, 4]"), std::string::npos) << msg;
  }
}

TEST(Loader, CheckReadsHeadersOnlyAndLeavesTheModuleAlone) {
  TwoLayers src(4);
  fill_random(src, 5);
  io::SafetensorsWriter w;
  add_parameters(w, src, "", io::DType::F32);
  std::string path = temp_file("check.safetensors");
  w.write(path);
  auto store = io::TensorStore::open_file(path, "test");
  TwoLayers dst(4);
  fill_random(dst, 6);
  at::Tensor before = dst.first->weight.clone();
  check_module(dst, store, {});
  EXPECT_TRUE(test::identical("first.weight", dst.first->weight, before));
  std::filesystem::remove(path);
}

TEST(Loader, TiedWeightsThroughAliases) {
  TwoLayers src(4);
  fill_random(src, 3);
  io::SafetensorsWriter w;
  add_parameters(w, src, "", io::DType::F32);
  at::Tensor t = src.norm->weight.contiguous();
  w.add("shared_copy_of_norm", io::DType::F32, {8}, t.data_ptr(), 32);
  LoadRules rules;
  rules.aliases["norm.weight"] = {"shared_copy_of_norm"};
  EXPECT_EQ(load_error(w, rules), "");
}

// Float8 tensors are decoded exactly while copied into the run dtype, also when presented from
// row runs in another order and when larger than one decoding block.
TEST(Loader, Float8IsDecodedExactlyPieceByPiece) {
  const int64_t rows = 4096, cols = 2048;  // 8 Mi codes: two blocks of the decoder
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < codes.size(); ++i) {
    uint8_t c = static_cast<uint8_t>((i * 37 + i / 256) & 0xff);
    if ((c & 0x7f) == 0x7f) c = 0x38;  // e4m3 NaN codes out (NaN never equals itself)
    if ((c & 0x7c) == 0x7c) c = 0x3c;  // e5m2 infinities and NaNs out
    codes[i] = c;
  }
  io::SafetensorsWriter w;
  w.add("e4m3", io::DType::F8_E4M3, {rows, cols}, codes.data(), codes.size());
  w.add("e5m2", io::DType::F8_E5M2, {rows, cols}, codes.data(), codes.size());
  const std::string path = temp_file("f8.safetensors");
  w.write(path);
  auto file = std::make_shared<io::SafetensorsFile>(path);
  // "swapped": the second half of the rows, then the first (as norm_out.linear is presented).
  io::TensorStore store = io::TensorStore::open_presented(
      file, "test", {{"e4m3", {{"e4m3", 0, -1}}, {}}, {"e5m2", {{"e5m2", 0, -1}}, {}},
                     {"swapped", {{"e4m3", rows / 2, rows}, {"e4m3", 0, rows / 2}}, {}}});
  at::Tensor want4 = at::empty({rows, cols}, at::kFloat), want5 = at::empty({rows, cols}, at::kFloat);
  io::decode_f8_e4m3(codes.data(), codes.size(), want4.data_ptr<float>());
  io::decode_f8_e5m2(codes.data(), codes.size(), want5.data_ptr<float>());
  EXPECT_TRUE(test::identical("e4m3 -> fp32", read_tensor(store, "e4m3", at::kFloat, at::kCPU), want4));
  EXPECT_TRUE(test::identical("e5m2 -> fp32", read_tensor(store, "e5m2", at::kFloat, at::kCPU), want5));
  // Every e4m3 value is a bf16 value: converting is exact.
  EXPECT_TRUE(test::identical("e4m3 -> bf16", read_tensor(store, "e4m3", at::kBFloat16, at::kCPU).to(at::kFloat), want4));
  EXPECT_TRUE(test::identical("e4m3 row runs swapped", read_tensor(store, "swapped", at::kFloat, at::kCPU),
                              at::cat({want4.narrow(0, rows / 2, rows / 2), want4.narrow(0, 0, rows / 2)})));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace fluxmpi::nn
