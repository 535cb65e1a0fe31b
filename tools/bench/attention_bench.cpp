// fluxmpi-bench-attention: the attention paths (nn::AttentionPath::Math, the chunked
// softmax(q k^T) v; ::Tiled, fluxmpi's tiled attention with an online softmax; ::Sdpa, libtorch
// >= 2's scaled_dot_product_attention) at the shapes fluxmpi's models attend with, on the CPU.
//
//   fluxmpi-bench-attention [--threads N] [--repeat R] [--dtype fp32|bf16|fp16[,...]] [--only TEXT]
//                           [--reference]
//
// Each shape runs the paths in turns, R rounds each (so that a slow spell of a shared machine
// hits all alike), and keeps each path's best time; the table shows the times, the ratios to the
// math path and the path attention() takes (auto). On a libtorch without SDPA that column is
// empty; Tiled runs for fp32 and bf16 only. --reference adds each path's largest difference from
// a float64 computation of the same attention (the math path in float64, head by head).
#include <boost/program_options.hpp>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/common/attention.h"
#include "models/common/tiled_attention.h"

namespace po = boost::program_options;
using namespace fluxmpi;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  const char* what;
  int64_t heads, tokens, head_dim;
  bool bias, causal;
  int64_t queries = 0;  // 0: every token attends (Lq = Lk); else a window of that many queries
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
    // --patches 4 of the bench model (tools/bench/bench.py --patches): a patch's queries over the
    // whole cached sequence.
    {"FLUX bench (6x128), 512^2 patch: 256 queries, 1152 keys", 6, 1024 + 128, 128, false, false, 256},
};

const char* label(nn::AttentionPath p) {
  switch (p) {
    case nn::AttentionPath::Math: return "math";
    case nn::AttentionPath::Sdpa: return "sdpa";
    case nn::AttentionPath::Tiled: return "tiled";
    default: return "auto";
  }
}

std::string fixed1(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", x);
  return b;
}
std::string fixed2(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", x);
  return b;
}
std::string sci(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1e", x);
  return b;
}

double time_ms(const std::function<at::Tensor()>& f, at::Tensor& out) {
  auto t0 = Clock::now();
  out = f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeat = 3;
  bool reference = false;
  std::string dtypes = "fp32", only;
  po::options_description opts("fluxmpi-bench-attention options");
  opts.add_options()("help", "this text")("threads", po::value(&threads), "intra-op threads (default 2)")(
      "repeat", po::value(&repeat), "rounds per path and shape (default 3)")(
      "dtype", po::value(&dtypes), "fp32, bf16, fp16, comma-separated (default fp32)")(
      "only", po::value(&only), "only the shapes whose name contains this text (e.g. CLIP)")(
      "reference", po::bool_switch(&reference), "also each path's largest difference from float64");
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
  std::printf("| shape | dtype | math ms | tiled ms | sdpa ms | tiled / math | tiled / sdpa |%s auto |\n",
              reference ? " max |diff| from float64: math / tiled / sdpa |" : "");
  std::printf("|---|---|---|---|---|---|---|%s---|\n", reference ? "---|" : "");
  std::stringstream list(dtypes);
  for (std::string name; std::getline(list, name, ',');) {
    FLUX_CHECK(name == "fp32" || name == "bf16" || name == "fp16", "--dtype: fp32, bf16 or fp16, not '", name, "'");
    const at::ScalarType dtype = name == "bf16" ? at::kBFloat16 : name == "fp16" ? at::kHalf : at::kFloat;
    for (const Shape& s : kShapes) {
      if (!only.empty() && std::string(s.what).find(only) == std::string::npos) continue;
      at::manual_seed(0);
      auto opt = at::TensorOptions().dtype(dtype);
      const int64_t lq = s.queries > 0 ? s.queries : s.tokens;
      at::Tensor q = at::randn({1, s.heads, lq, s.head_dim}, opt);
      at::Tensor k = at::randn({1, s.heads, s.tokens, s.head_dim}, opt);
      at::Tensor v = at::randn({1, s.heads, s.tokens, s.head_dim}, opt);
      at::Tensor bias = s.bias ? at::randn({1, s.heads, lq, s.tokens}, opt) : at::Tensor();
      std::vector<nn::AttentionPath> paths = {nn::AttentionPath::Math};
      if (nn::tiled_attention_applies(q)) paths.push_back(nn::AttentionPath::Tiled);
      if (sdpa) paths.push_back(nn::AttentionPath::Sdpa);
      std::map<nn::AttentionPath, double> best;
      std::map<nn::AttentionPath, at::Tensor> out;
      for (nn::AttentionPath p : paths) best[p] = std::numeric_limits<double>::infinity();
      for (int r = 0; r < repeat; ++r)
        for (nn::AttentionPath p : paths)
          best[p] = std::min(best[p], time_ms([&] { return nn::attention_via(p, q, k, v, bias, std::nullopt, s.causal); }, out[p]));
      auto ms = [&](nn::AttentionPath p) { return best.count(p) ? fixed1(best[p]) : std::string("-"); };
      auto ratio = [&](nn::AttentionPath a, nn::AttentionPath b) {
        return best.count(a) && best.count(b) ? fixed2(best[a] / best[b]) : std::string("-");
      };
      std::string diffs;
      if (reference) {
        const at::Tensor truth = nn::attention_via(nn::AttentionPath::Math, q.to(at::kDouble), k.to(at::kDouble),
                                                   v.to(at::kDouble), bias.defined() ? bias.to(at::kDouble) : bias,
                                                   std::nullopt, s.causal);
        for (nn::AttentionPath p : {nn::AttentionPath::Math, nn::AttentionPath::Tiled, nn::AttentionPath::Sdpa})
          diffs += str_cat(diffs.empty() ? " " : " / ",
                           out.count(p) ? sci(( out[p].to(at::kDouble) - truth).abs().max().item<double>()) : "-");
        diffs += " |";
      }
      std::printf("| %s | %s | %s | %s | %s | %s | %s |%s %s |\n", s.what, name.c_str(), ms(nn::AttentionPath::Math).c_str(),
                  ms(nn::AttentionPath::Tiled).c_str(), ms(nn::AttentionPath::Sdpa).c_str(),
                  ratio(nn::AttentionPath::Tiled, nn::AttentionPath::Math).c_str(),
                  ratio(nn::AttentionPath::Tiled, nn::AttentionPath::Sdpa).c_str(), diffs.c_str(),
                  label(nn::default_attention_path(q)));
      std::fflush(stdout);
    }
  }
  return 0;
}
