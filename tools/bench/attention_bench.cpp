// fluxmpi-bench-attention: the two attention paths (nn::AttentionPath::Math, the chunked
// softmax(q k^T) v, and ::Sdpa, libtorch >= 2's scaled_dot_product_attention) at the shapes
// fluxmpi's models attend with, on the CPU.
//
//   fluxmpi-bench-attention [--threads N] [--repeat R] [--dtype fp32|bf16|fp16[,...]] [--only TEXT]
//
// Each shape runs both paths in turns, R rounds each (so that a slow spell of a shared machine
// hits both alike), and keeps each path's best time; the table shows the times, their ratio and
// the largest difference between the two outputs, and the path attention() takes (auto). On a
// libtorch without SDPA only Math runs.
#include <boost/program_options.hpp>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/common/attention.h"

namespace po = boost::program_options;
using namespace fluxmpi;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  const char* what;
  int64_t heads, tokens, head_dim;
  bool bias, causal;
};

// The shapes of the models at the sizes the benchmarks and users run.
const Shape kShapes[] = {
    {"FLUX D=512 (8x64), 256^2, 256 text tokens", 8, 256 + 256, 64, false, false},
    {"FLUX D=512 (8x64), 512^2, 256 text tokens", 8, 1024 + 256, 64, false, false},
    {"FLUX D=512 (8x64), 1024^2, 512 text tokens", 8, 4096 + 512, 64, false, false},
    {"FLUX D=3072 (24x128), 512^2, 512 text tokens", 24, 1024 + 512, 128, false, false},
    {"FLUX D=3072 (24x128), 1024^2, 512 text tokens", 24, 4096 + 512, 128, false, false},
    {"T5-XXL (64x64), 512 tokens, position bias", 64, 512, 64, true, false},
    {"CLIP-L (12x64), 77 tokens, causal", 12, 77, 64, false, true},
    {"VAE mid block (1x512), 512^2 image (64^2 latent)", 1, 4096, 512, false, false},
};

double time_ms(const std::function<at::Tensor()>& f, at::Tensor& out) {
  auto t0 = Clock::now();
  out = f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeat = 3;
  std::string dtypes = "fp32", only;
  po::options_description opts("fluxmpi-bench-attention options");
  opts.add_options()("help", "this text")("threads", po::value(&threads), "intra-op threads (default 2)")(
      "repeat", po::value(&repeat), "rounds per path and shape (default 3)")(
      "dtype", po::value(&dtypes), "fp32, bf16, fp16, comma-separated (default fp32)")(
      "only", po::value(&only), "only the shapes whose name contains this text (e.g. CLIP)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fluxmpi-bench-attention: %s\n", e.what());
    return 2;
  }
  if (vm.count("help")) {
    std::ostringstream os;
    os << opts;
    std::printf("%s", os.str().c_str());
    return 0;
  }
  at::set_num_threads(threads);
  c10::InferenceMode guard;
  const bool sdpa = nn::sdpa_available();
  std::printf("libtorch %s, %d threads, best of %d; SDPA %s\n\n", TORCH_VERSION, threads, repeat,
              sdpa ? "available" : "not available (libtorch < 2)");
  std::printf("| shape | dtype | math ms | sdpa ms | sdpa / math | max |diff| | auto |\n|---|---|---|---|---|---|---|\n");
  std::stringstream list(dtypes);
  for (std::string name; std::getline(list, name, ',');) {
    FLUX_CHECK(name == "fp32" || name == "bf16" || name == "fp16", "--dtype: fp32, bf16 or fp16, not '", name, "'");
    const at::ScalarType dtype = name == "bf16" ? at::kBFloat16 : name == "fp16" ? at::kHalf : at::kFloat;
    for (const Shape& s : kShapes) {
      if (!only.empty() && std::string(s.what).find(only) == std::string::npos) continue;
      at::manual_seed(0);
      auto opt = at::TensorOptions().dtype(dtype);
      at::Tensor q = at::randn({1, s.heads, s.tokens, s.head_dim}, opt);
      at::Tensor k = at::randn({1, s.heads, s.tokens, s.head_dim}, opt);
      at::Tensor v = at::randn({1, s.heads, s.tokens, s.head_dim}, opt);
      at::Tensor bias = s.bias ? at::randn({1, s.heads, s.tokens, s.tokens}, opt) : at::Tensor();
      auto run = [&](nn::AttentionPath p) { return nn::attention_via(p, q, k, v, bias, std::nullopt, s.causal); };
      double math = std::numeric_limits<double>::infinity(), fused = math;
      at::Tensor out_math, out_sdpa;
      for (int r = 0; r < repeat; ++r) {
        math = std::min(math, time_ms([&] { return run(nn::AttentionPath::Math); }, out_math));
        if (sdpa) fused = std::min(fused, time_ms([&] { return run(nn::AttentionPath::Sdpa); }, out_sdpa));
      }
      const char* chosen = nn::default_attention_path(q) == nn::AttentionPath::Sdpa ? "sdpa" : "math";
      if (sdpa) {
        const double diff = (out_math.to(at::kFloat) - out_sdpa.to(at::kFloat)).abs().max().item<double>();
        std::printf("| %s | %s | %.1f | %.1f | %.2f | %.2e | %s |\n", s.what, name.c_str(), math, fused, fused / math, diff,
                    chosen);
      } else {
        std::printf("| %s | %s | %.1f | - | - | - | %s |\n", s.what, name.c_str(), math, chosen);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
