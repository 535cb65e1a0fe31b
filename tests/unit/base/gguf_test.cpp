// GGUF reader (io/gguf.h) and dequantization (io/dequantize.h), torch-free: valid headers as
// presented tensors (torch-order shapes, byte ranges); every malformation the issue lists rejected
// with one message naming the file and the tensor; the fixture files (tests/fixtures/gguf, made by
// tools/fixtures/gguf_fixtures.py with gguf-py 0.19) parsed; the ten block types dequantized bit
// for bit as diffusers 0.40 does (the fixture's dequant/blocks.safetensors: random blocks with
// normal, subnormal, overflowing and signed-zero fp16 scales) by every dequantization kernel the CPU
// has, into float32 and bf16; the vector kernels against the scalar one on random bytes; fp16
// rounding against a brute-force nearest-value search, bf16 rounding on its edge cases.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/dequantize.h"
#include "io/gguf.h"
#include "io/single_file.h"
#include "support/gguf_builder.h"

namespace fluxmpi::io {
namespace {
namespace fs = std::filesystem;
using test::GgufBuilder;

std::string fixture_dir() {
  return (fs::path(FLUXMPI_SOURCE_DIR) / "tests" / "fixtures" / "gguf").string();
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    parse_gguf_header(bytes.data(), bytes.size(), "bad.gguf");
  } catch (const WeightError& e) {
    return e.what();
  }
  return "";
}

GgufBuilder small_file() {
  GgufBuilder b;
  b.add_string("general.architecture", "flux");
  b.add_u32("general.quantization_version", 2);
  b.add_tensor("double_blocks.0.img_attn.qkv.weight", {96, 64}, GgmlType::Q8_0);
  b.add_tensor("img_in.bias", {32}, GgmlType::F32);
  b.add_tensor("txt_in.weight", {32, 256}, GgmlType::Q4_K);
  return b;
}

TEST(GgufHeader, PresentsTensorsInTorchOrder) {
  const std::vector<uint8_t> bytes = small_file().bytes();
  const GgufHeader h = parse_gguf_header(bytes.data(), bytes.size(), "ok.gguf");
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(h.alignment, 32u);
  EXPECT_EQ(h.string("general.architecture"), "flux");
  ASSERT_EQ(h.index.tensors.size(), 3u);
  const TensorEntry* qkv = h.index.find("double_blocks.0.img_attn.qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->dtype, DType::Q8_0);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(qkv->num_bytes(), 96u * 2 * 34);  // two blocks of 34 bytes per row
  const TensorEntry* txt = h.index.find("txt_in.weight");
  EXPECT_EQ(txt->num_bytes(), 32u * 144);
  EXPECT_EQ(h.index.data_offset % 32, 0u);
  EXPECT_EQ(describe_dtypes(h.index), "F32 x 1, Q4_K x 1, Q8_0 x 1");
}

TEST(GgufHeader, RejectsEveryMalformation) {
  const GgufBuilder good = small_file();
  const std::vector<uint8_t> ok = good.bytes();
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
    std::string expect;
  };
  std::vector<Case> cases;
  {
    auto b = ok;
    b[0] = 'X';
    cases.push_back({"bad magic", b, "not a GGUF file"});
  }
  {
    auto b = ok;
    b[4] = 1;
    cases.push_back({"version 1", b, "GGUF version 1 is not supported"});
  }
  cases.push_back({"truncated inside the header", std::vector<uint8_t>(ok.begin(), ok.begin() + 60), "more than the file can hold"});
  cases.push_back({"truncated inside the tensor infos", std::vector<uint8_t>(ok.begin(), ok.begin() + 200), "truncated"});
  cases.push_back({"truncated data", std::vector<uint8_t>(ok.begin(), ok.end() - 100),
                   "tensor 'txt_in.weight' (Q4_K, dims {256, 32}, 4608 bytes at offset"});
  {
    GgufBuilder b = good;
    b.tensors()[1].offset = 16;  // not a multiple of 32
    cases.push_back({"misaligned offset", b.bytes(), "tensor 'img_in.bias': offset 16 is not a multiple of the alignment 32"});
  }
  {
    GgufBuilder b = good;
    b.tensors()[2].offset = 1u << 30;
    cases.push_back({"offset past the end", b.bytes(), "tensor 'txt_in.weight' (Q4_K"});
  }
  {
    GgufBuilder b = good;
    b.tensors()[1].offset = b.tensors()[0].offset;
    cases.push_back({"overlap", b.bytes(), "overlaps tensor"});
  }
  {
    GgufBuilder b = good;
    b.tensors()[1].type = 99;
    cases.push_back({"unknown type", b.bytes(), "tensor 'img_in.bias' has quantization type type 99, which fluxmpi does not read"});
  }
  {
    GgufBuilder b = good;
    b.tensors()[1].type = static_cast<uint32_t>(GgmlType::IQ2_XXS);
    cases.push_back({"unsupported type", b.bytes(), "tensor 'img_in.bias' has quantization type IQ2_XXS"});
  }
  {
    GgufBuilder b;
    b.add_tensor("w", {4, 48}, GgmlType::Q8_0);  // 48 is not whole blocks of 32
    cases.push_back({"partial block", b.bytes(), "tensor 'w' of dims {48, 4}: its rows of 48 elements are not whole Q8_0 blocks of 32"});
  }
  {
    GgufBuilder b;
    b.add_tensor("w", {4, 32}, GgmlType::F32);
    b.add_tensor("w", {4, 32}, GgmlType::F32);
    cases.push_back({"name twice", b.bytes(), "tensor 'w' is listed twice"});
  }
  {
    GgufBuilder b;
    b.add_tensor("w", {2, 2, 2, 2, 2}, GgmlType::F32);
    cases.push_back({"five dims", b.bytes(), "tensor 'w' has 5 dimensions"});
  }
  {
    GgufBuilder b;
    b.add_tensor("w", {1, 1, 1, 1}, GgmlType::F32);
    b.tensors()[0].ne = {uint64_t{1} << 62, uint64_t{1} << 62, 1, 1};
    cases.push_back({"dims overflow", b.bytes(), "tensor 'w': the product of its dimensions overflows"});
  }
  {
    auto b = ok;
    b[8] = 0xff;  // tensor count far beyond the file
    b[14] = 0x7f;
    cases.push_back({"huge tensor count", b, "tensor count"});
  }
  {
    GgufBuilder b;
    b.add_u32("general.alignment", 24);
    b.add_tensor("w", {4, 32}, GgmlType::F32);
    cases.push_back({"alignment not a power of two", b.bytes(), "'general.alignment' must be a power of two"});
  }
  for (const Case& c : cases) {
    const std::string error = parse_error(c.bytes);
    EXPECT_NE(error.find("'bad.gguf'"), std::string::npos) << c.what << ": " << error;
    EXPECT_NE(error.find(c.expect), std::string::npos) << c.what << ": got \"" << error << "\", expected \"" << c.expect << "\"";
  }
}

TEST(GgufHeader, EveryPrefixOfAValidFileIsRejectedOrParsed) {
  // No prefix may crash or read past its end (the sanitizer build checks the reads).
  const std::vector<uint8_t> ok = small_file().bytes();
  for (size_t n = 0; n < ok.size(); n += 7) {
    const std::vector<uint8_t> prefix(ok.begin(), ok.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(parse_error(prefix).empty()) << "prefix of " << n << " bytes";
  }
}

TEST(GgufFixtures, TheGeneratedFilesParseAndMapOntoTheDiffusersKeys) {
  for (const char* model : {"tiny-flux1-dev-gguf", "tiny-flux2-dev-gguf"}) {
    const std::string path = (fs::path(fixture_dir()) / model / "transformer.gguf").string();
    if (!fs::exists(path)) FAIL() << "missing fixture " << path;
    GgufFile f(path);
    EXPECT_EQ(f.gguf().string("general.architecture"), "flux") << path;
    const auto found = detect_components(f.header());
    ASSERT_EQ(found.size(), 1u) << path;
    EXPECT_EQ(found[0].component, Component::Transformer);
    EXPECT_EQ(found[0].layout, KeyLayout::OriginalFlux);
    int quantized = 0;
    for (const auto& e : f.header().tensors) quantized += is_quantized(e.dtype) ? 1 : 0;
    EXPECT_GT(quantized, 10) << path;
    EXPECT_TRUE(is_gguf_file(path));
  }
}

const DType kBlockTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                             DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

std::vector<DequantizeKernel> supported_kernels() {
  std::vector<DequantizeKernel> out;
  for (DequantizeKernel k : {DequantizeKernel::Scalar, DequantizeKernel::Avx2, DequantizeKernel::Avx512})
    if (dequantize_kernel_supported(k)) out.push_back(k);
  return out;
}

// Sets a dequantization kernel for a scope, then the default again.
struct KernelScope {
  DequantizeKernel before = dequantize_kernel();
  explicit KernelScope(DequantizeKernel k) { set_dequantize_kernel(k); }
  ~KernelScope() { set_dequantize_kernel(before); }
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Reads the fixture's safetensors file of blocks and values; every kernel this CPU has, into float
// and into bf16 (the bf16 bits: the fp16 value rounded to nearest even, torch's cast).
TEST(Dequantize, EveryBlockTypeAsDiffusers) {
  const std::string path = (fs::path(fixture_dir()) / "dequant" / "blocks.safetensors").string();
  if (!fs::exists(path)) FAIL() << "missing fixture " << path;
  SafetensorsFile f(path);
  for (DequantizeKernel kernel : supported_kernels()) {
    KernelScope scope(kernel);
    const std::string kname = dequantize_kernel_name(kernel);
    int checked = 0;
    for (DType t : kBlockTypes) {
      const std::string name = dtype_name(t);
      const TensorEntry* blocks = f.find("blocks_" + name);
      const TensorEntry* values = f.find("values_" + name);
      ASSERT_TRUE(blocks && values) << name;
      const int64_t n = values->shape[0];
      ASSERT_EQ(blocks->num_bytes(), row_bytes(t, n)) << name;
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      std::memcpy(want.data(), f.data(*values), values->num_bytes());
      // As one row, and as rows of one block each; into bf16 as one row.
      dequantize_rows(t, f.data(*blocks), 1, n, got.data(), n);
      const int64_t per = static_cast<int64_t>(block_elements(t));
      std::vector<float> by_block(static_cast<size_t>(n));
      dequantize_rows(t, f.data(*blocks), n / per, per, by_block.data(), per);
      std::vector<uint16_t> bf16(static_cast<size_t>(n));
      dequantize_rows_bf16(t, f.data(*blocks), 1, n, bf16.data(), n);
      int64_t mismatches = 0, first = -1;
      for (int64_t i = 0; i < n; ++i) {
        const bool same = same_bits(got[i], want[i]) || (std::isnan(got[i]) && std::isnan(want[i]));
        const bool same_blocks = same_bits(by_block[i], got[i]) || (std::isnan(got[i]) && std::isnan(by_block[i]));
        const bool same_bf16 = bf16[i] == float_to_bf16(want[i]);
        if (!same || !same_blocks || !same_bf16) {
          ++mismatches;
          if (first < 0) first = i;
        }
      }
      EXPECT_EQ(mismatches, 0) << kname << " " << name << ": " << mismatches << " of " << n
                               << " values differ from diffusers', first at " << first << " ("
                               << (first >= 0 ? got[first] : 0.f) << " vs " << (first >= 0 ? want[first] : 0.f) << ")";
      ++checked;
      std::cout << "[ measured ] " << kname << " " << name << ": " << n
                << " values bit-identical to diffusers' dequantization (float32 and bf16)\n";
    }
    EXPECT_EQ(checked, 10);
  }
}

// Blocks of random bytes (so also infinite and NaN fp16 scales, which the vector kernels leave to
// the scalar code): every kernel gives the scalar kernel's bits, into float and into bf16.
TEST(Dequantize, EveryKernelGivesTheScalarBits) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next_byte = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint8_t>(state >> 56);
  };
  const int64_t rows = 3, blocks_per_row = 40;
  for (DType t : kBlockTypes) {
    const int64_t cols = blocks_per_row * static_cast<int64_t>(block_elements(t));
    std::vector<uint8_t> bytes(row_bytes(t, cols) * rows);
    for (uint8_t& b : bytes) b = next_byte();
    std::vector<float> want(static_cast<size_t>(rows * cols));
    {
      KernelScope scope(DequantizeKernel::Scalar);
      dequantize_rows(t, bytes.data(), rows, cols, want.data(), cols);
    }
    int64_t non_finite = 0;
    for (float v : want) non_finite += std::isfinite(v) ? 0 : 1;
    for (DequantizeKernel kernel : supported_kernels()) {
      KernelScope scope(kernel);
      std::vector<float> got(want.size());
      std::vector<uint16_t> bf16(want.size());
      dequantize_rows(t, bytes.data(), rows, cols, got.data(), cols);
      dequantize_rows_bf16(t, bytes.data(), rows, cols, bf16.data(), cols);
      int64_t mismatches = 0, first = -1;
      for (size_t i = 0; i < want.size(); ++i)
        if (!same_bits(got[i], want[i]) || bf16[i] != float_to_bf16(want[i])) {
          ++mismatches;
          if (first < 0) first = static_cast<int64_t>(i);
        }
      EXPECT_EQ(mismatches, 0) << dequantize_kernel_name(kernel) << " " << dtype_name(t) << ": " << mismatches
                               << " of " << want.size() << " values differ from the scalar kernel's, first at " << first;
    }
    std::cout << "[ measured ] " << dtype_name(t) << ": " << want.size() << " values (" << non_finite
              << " not finite) alike in " << supported_kernels().size() << " kernels\n";
  }
}

TEST(Dequantize, Bf16RoundingIsNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::ldexp(1.0f, -8) + 1.0f), 0x3f80);  // a tie: to the even 1.0
  EXPECT_EQ(float_to_bf16(std::ldexp(3.0f, -8) + 1.0f), 0x3f82);  // a tie: up to the even 1 + 2^-6
  EXPECT_EQ(float_to_bf16(std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20) + 1.0f), 0x3f81);
  EXPECT_EQ(float_to_bf16(65504.0f), 0x4780);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bf16(NAN), 0x7fc0);
}

TEST(Dequantize, HalfRoundingIsNearestEven) {
  // Every float on a grid around the fp16 range against the nearest fp16 value found by search.
  std::vector<float> halves;
  for (uint32_t h = 0; h < 0x7c00; ++h) halves.push_back(half_to_float(static_cast<uint16_t>(h)));
  for (float x = 1e-9f; x < 70000.f; x *= 1.0009f) {
    const uint16_t got = float_to_half(x);
    auto it = std::lower_bound(halves.begin(), halves.end(), x);
    uint16_t want;
    if (it == halves.end()) {
      want = x >= 65520.f ? 0x7c00 : 0x7bff;
    } else if (it == halves.begin() || *it == x) {
      want = static_cast<uint16_t>(it - halves.begin());
    } else {
      const float hi = *it, lo = *(it - 1);
      const uint16_t hi_bits = static_cast<uint16_t>(it - halves.begin());
      if (x - lo < hi - x) want = hi_bits - 1;
      else if (hi - x < x - lo) want = hi_bits;
      else want = (hi_bits % 2 == 0) ? hi_bits : hi_bits - 1;
    }
    ASSERT_EQ(got, want) << "x = " << x;
    ASSERT_EQ(float_to_half(-x), want | 0x8000) << "x = " << -x;
  }
}

}  // namespace
}  // namespace fluxmpi::io
