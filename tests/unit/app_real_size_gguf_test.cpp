// GGUF transformers at real size without the weights: hollow GGUF files (the real tensor list of
// city96's FLUX.1-dev Q8_0 / Q4_K and FLUX.2 [dev] Q4_K conversions over a file hole:
// tests/support/gguf_builder.h) beside the hollow pipeline folders of the other real-size tests,
// through `fluxmpi --dry-run`: the planner counts each tensor as it is held (block-quantized
// tensors at their stored bytes, the others in the run dtype), on 2, 4 and 8 ranks of 12, 16 and
// 24 GiB; every plan made keeps every rank under its budget, every refusal is one line; the
// user story of issue 36 (FLUX.2 [dev] Q4_K on four 16 GiB cards) plans.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "app/prepare.h"
#include "core/error.h"
#include "core/units.h"
#include "io/flux2_original_keys.h"
#include "io/flux_original_keys.h"
#include "io/model_dir.h"
#include "io/single_file.h"
#include "support/fixtures.h"
#include "support/gguf_builder.h"
#include "support/hollow_flux2.h"
#include "support/hollow_model.h"

namespace fluxmpi::app {
namespace {
namespace fs = std::filesystem;
constexpr uint64_t kGiB = 1ull << 30;

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// city96's storage choices (ComfyUI-GGUF tools/convert.py and lcpp.patch): 1-D and tiny tensors
// F32, the input layers and the final linear F32, the text input, the other embedder layers and
// the final modulation F16, every other weight in the file's quantization.
io::GgmlType storage(const std::string& name, const std::vector<int64_t>& shape, io::GgmlType quant) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (shape.size() == 1 || n <= 1024) return io::GgmlType::F32;
  for (const char* p : {"img_in.", "time_in.in_layer.", "vector_in.in_layer.", "guidance_in.in_layer.", "final_layer.linear."})
    if (starts_with(name, p)) return io::GgmlType::F32;
  for (const char* p : {"txt_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer."})
    if (starts_with(name, p)) return io::GgmlType::F16;
  return quant;
}

// The original-layout tensors of a model, from the diffusers shapes and the key map's row runs.
template <typename Shapes, typename Pieces>
std::map<std::string, std::vector<int64_t>> original_shapes(const Shapes& shapes, const Pieces& pieces) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& [key, shape] : shapes) {
    for (const io::OriginalRows& p : pieces(key)) {
      std::vector<int64_t>& s = out[p.original_key];
      if (s.empty()) {
        s = shape;
        s[0] = 0;
      }
      s[0] = std::max(s[0], p.row_end < 0 ? shape[0] : p.row_end);
    }
  }
  return out;
}

struct Written {
  std::string path;
  uint64_t held_bf16 = 0;  // what the ranks hold in bf16 runs: quantized at their bytes, the rest 2 bytes each
};

Written write_gguf(const std::map<std::string, std::vector<int64_t>>& tensors, io::GgmlType quant, const std::string& path) {
  test::GgufBuilder b;
  b.add_string("general.architecture", "flux");
  b.add_u32("general.quantization_version", 2);
  Written w{path, 0};
  for (const auto& [name, shape] : tensors) {
    const io::GgmlType t = storage(name, shape, quant);
    b.add_tensor(name, shape, t);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    io::DType d{};
    io::dtype_of_ggml_type(static_cast<uint32_t>(t), &d);
    w.held_bf16 += io::is_quantized(d) ? b.tensors().back().bytes : static_cast<uint64_t>(n) * 2;
  }
  b.write_hollow(path);
  return w;
}

class RealSizeGguf : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("fluxmpi-real-size-gguf-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    if (!fs::is_directory(fs::path(test::fixture_root()) / "flux2")) return;  // the FLUX.2 tokenizers come from there
    flux1_ = test::write_hollow_model("FLUX.1-dev", (root_ / "FLUX.1-dev").string()).root;
    flux2_ = test::write_hollow_flux2_model("FLUX.2-dev", (root_ / "FLUX.2-dev").string()).root;
    const io::TransformerConfig c1 = io::ModelDir(flux1_).transformer_config();
    const auto t1 = original_shapes(io::flux_diffusers_shapes(c1),
                                    [&](const std::string& k) { return io::flux_original_pieces(k, c1); });
    files_["flux1-dev-Q8_0"] = write_gguf(t1, io::GgmlType::Q8_0, (root_ / "flux1-dev-Q8_0.gguf").string());
    files_["flux1-dev-Q4_K"] = write_gguf(t1, io::GgmlType::Q4_K, (root_ / "flux1-dev-Q4_K.gguf").string());
    const io::Flux2TransformerConfig c2 = io::ModelDir(flux2_).flux2_transformer_config();
    const auto t2 = original_shapes(io::flux2_diffusers_shapes(c2),
                                    [&](const std::string& k) { return io::flux2_original_pieces(k, c2); });
    files_["flux2-dev-Q4_K"] = write_gguf(t2, io::GgmlType::Q4_K, (root_ / "flux2-dev-Q4_K.gguf").string());
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  void SetUp() override {
    if (flux2_.empty()) {
      const std::string why = "flux2 fixtures (their tokenizers) not found under '" + test::fixture_root() + "'";
      if (test::running_in_ci()) FAIL() << why;
      GTEST_SKIP() << why;
    }
  }
  static Preparation dry_run(const std::string& model, const std::string& file, int ranks, const std::string& budget) {
    return prepare_run({"--model", model, "--gguf", file, "--dry-run", "--dtype", "bf16", "--max-memory", budget}, ranks);
  }

  static fs::path root_;
  static std::string flux1_, flux2_;
  static std::map<std::string, Written> files_;
};
fs::path RealSizeGguf::root_;
std::string RealSizeGguf::flux1_, RealSizeGguf::flux2_;
std::map<std::string, Written> RealSizeGguf::files_;

TEST_F(RealSizeGguf, PlansCountTheStoredBytesOnTwoFourAndEightRanks) {
  for (const auto& [name, w] : files_) {
    const std::string& model = name.rfind("flux2", 0) == 0 ? flux2_ : flux1_;
    std::cout << "[ measured ] " << name << ": " << format_bytes(w.held_bf16) << " held in a bf16 run ("
              << format_bytes(fs::file_size(w.path)) << " file)\n";
    for (int ranks : {2, 4, 8})
      for (int gib : {12, 16, 24}) {
        const std::string where = str_cat(name, " on ", ranks, " ranks of ", gib, " GiB");
        try {
          const Preparation p = dry_run(model, w.path, ranks, str_cat(gib, "GiB"));
          ASSERT_TRUE(p.dry_run_plan.has_value()) << where;
          EXPECT_NE(p.output.find("(GGUF, original FLUX keys;"), std::string::npos) << where << "\n" << p.output;
          EXPECT_NE(p.output.find("as held: GGUF:"), std::string::npos) << where << "\n" << p.output;
          uint64_t weights = 0, peak = 0;
          for (int r = 0; r < ranks; ++r) {
            EXPECT_LE(p.dry_run_plan->estimate(r).peak_bytes, static_cast<uint64_t>(gib) * kGiB) << where << ", rank " << r;
            weights += p.dry_run_plan->estimate(r).weight_bytes;
            peak = std::max(peak, p.dry_run_plan->estimate(r).peak_bytes);
          }
          EXPECT_EQ(weights, w.held_bf16) << where;
          std::cout << "[ measured ] " << where << ": planned, largest rank peak " << format_bytes(peak) << "\n";
          if (ranks == 2 && gib == 24) {
            const size_t at = p.output.find("FLUX transformer:");
            std::cout << "[ measured ] " << p.output.substr(at, p.output.find('\n', at) - at) << "\n";
          }
        } catch (const UsageError& e) {
          const std::string m = e.what();
          EXPECT_EQ(m.find('\n'), std::string::npos) << where << ": " << m;
          EXPECT_NE(m.find("--max-memory"), std::string::npos) << where << ": " << m;
          std::cout << "[ measured ] " << where << ": refused: " << m.substr(0, 160) << "...\n";
        }
      }
  }
}

TEST_F(RealSizeGguf, TheQuantizedFilesFitWhereTheDenseWeightsDoNot) {
  // The user: FLUX.2 [dev] Q4_K on four 16 GiB cards (its bf16 weights, 64 GB, do not fit).
  EXPECT_NO_THROW(dry_run(flux2_, files_.at("flux2-dev-Q4_K").path, 4, "16GiB"));
  EXPECT_THROW(prepare_run({"--model", flux2_, "--dry-run", "--dtype", "bf16", "--max-memory", "16GiB"}, 4), UsageError);
  // FLUX.1-dev Q8_0 on two 12 GiB ranks (24 GB of bf16 weights would not fit).
  EXPECT_NO_THROW(dry_run(flux1_, files_.at("flux1-dev-Q8_0").path, 2, "12GiB"));
  EXPECT_THROW(prepare_run({"--model", flux1_, "--dry-run", "--dtype", "bf16", "--max-memory", "12GiB"}, 2), UsageError);
}

}  // namespace
}  // namespace fluxmpi::app
