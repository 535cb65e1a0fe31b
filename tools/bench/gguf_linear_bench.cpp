// fluxmpi-bench-gguf-linear: the cost of a GGUF-quantized linear layer on the CPU (docs/performance.md,
// "GGUF weights"): the dequantization kernels (io/dequantize.h: scalar, AVX2 + F16C, AVX-512) in ns
// per weight element, and one quantized_linear call (models/common/quantized_linear.h) dequantizing
// panel by panel or the whole matrix at once, against the same product with a dense weight.
//
//   fluxmpi-bench-gguf-linear [--threads N] [--repeat R] [--dtype bf16|fp32] [--tokens 384,1536]
//                             [--types Q8_0,Q4_K,Q6_K] [--only TEXT]
//
// The weights are random blocks with small finite fp16 scales. Each shape runs its variants in
// turns, R rounds (so that a slow spell of a shared machine hits all alike), and keeps each
// variant's median.
#include <boost/program_options.hpp>
#include <c10/core/InferenceMode.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/dequantize.h"
#include "models/common/quantized_linear.h"

namespace po = boost::program_options;
using namespace fluxmpi;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  const char* what;
  int64_t out, in;
};

// FLUX.1's largest projections: the bench's medium model (D 1024) and FLUX.1-dev (D 3072).
const Shape kShapes[] = {
    {"D=1024 to_q", 1024, 1024},
    {"D=1024 single linear1 (qkv + mlp)", 7 * 1024, 1024},
    {"D=1024 ff down", 1024, 4 * 1024},
    {"D=3072 to_q", 3072, 3072},
    {"D=3072 single linear1 (qkv + mlp)", 7 * 3072, 3072},
};

// Offsets of a block's fp16 scales (d, and dmin / m where the type has one).
std::vector<int> scale_offsets(io::DType t) {
  switch (t) {
    case io::DType::Q8_0: case io::DType::Q4_0: case io::DType::Q5_0: return {0};
    case io::DType::Q4_1: case io::DType::Q5_1: case io::DType::Q4_K: case io::DType::Q5_K: return {0, 2};
    case io::DType::Q2_K: return {80, 82};
    case io::DType::Q3_K: return {108};
    case io::DType::Q6_K: return {208};
    default: throw UsageError(str_cat("--types: ", io::dtype_name(t), " is not a block type"));
  }
}

io::DType parse_type(const std::string& name) {
  for (io::DType t : {io::DType::Q8_0, io::DType::Q4_0, io::DType::Q4_1, io::DType::Q5_0, io::DType::Q5_1, io::DType::Q2_K,
                      io::DType::Q3_K, io::DType::Q4_K, io::DType::Q5_K, io::DType::Q6_K})
    if (name == io::dtype_name(t)) return t;
  throw UsageError(str_cat("--types: unknown block type '", name, "'"));
}

nn::QuantizedWeight random_weight(io::DType t, int64_t out, int64_t in, std::mt19937& rng) {
  nn::QuantizedWeight w;
  w.in_features = in;
  const int64_t row = static_cast<int64_t>(io::row_bytes(t, in)), block = static_cast<int64_t>(io::block_bytes(t));
  at::Tensor bytes = at::randint(0, 256, {out, row}, at::kByte);
  uint8_t* p = bytes.data_ptr<uint8_t>();
  std::uniform_int_distribution<int> scale(0x1000, 0x1fff);  // fp16 in [2^-11, 2^-7): small, finite
  for (int64_t b = 0; b < out * row / block; ++b)
    for (int off : scale_offsets(t)) {
      const int s = scale(rng);
      p[b * block + off] = static_cast<uint8_t>(s & 0xff);
      p[b * block + off + 1] = static_cast<uint8_t>(s >> 8);
    }
  w.runs.push_back({t, bytes});
  return w;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description opts("fluxmpi-bench-gguf-linear options");
  opts.add_options()("threads", po::value<int>()->default_value(2), "intra-op threads")(
      "repeat", po::value<int>()->default_value(5), "rounds (median)")(
      "dtype", po::value<std::string>()->default_value("bf16"), "bf16 | fp32")(
      "tokens", po::value<std::string>()->default_value("384,1536"), "rows of x (tokens x microbatch), comma-separated")(
      "types", po::value<std::string>()->default_value("Q8_0,Q4_K,Q6_K"), "block types")(
      "only", po::value<std::string>()->default_value(""), "shapes whose name contains TEXT")("help,h", "this help");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fluxmpi-bench-gguf-linear: %s\n", e.what());
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  try {
    c10::InferenceMode guard;
    at::set_num_threads(vm["threads"].as<int>());
    const int repeat = std::max(1, vm["repeat"].as<int>());
    const std::string dt = vm["dtype"].as<std::string>();
    if (dt != "bf16" && dt != "fp32") throw UsageError("--dtype: bf16 or fp32");
    const at::ScalarType dtype = dt == "bf16" ? at::kBFloat16 : at::kFloat;
    std::vector<int64_t> tokens;
    for (const std::string& t : split(vm["tokens"].as<std::string>())) tokens.push_back(std::stoll(t));
    std::vector<io::DType> types;
    for (const std::string& t : split(vm["types"].as<std::string>())) types.push_back(parse_type(t));
    std::vector<io::DequantizeKernel> kernels;
    for (io::DequantizeKernel k : {io::DequantizeKernel::Scalar, io::DequantizeKernel::Avx2, io::DequantizeKernel::Avx512})
      if (io::dequantize_kernel_supported(k)) kernels.push_back(k);
    const io::DequantizeKernel best = io::dequantize_kernel();
    std::mt19937 rng(1);
    std::printf("threads %d, %s, median of %d rounds; dequantization kernels: ", at::get_num_threads(), dt.c_str(), repeat);
    for (io::DequantizeKernel k : kernels) std::printf("%s ", io::dequantize_kernel_name(k));
    std::printf("(default %s)\n\n", io::dequantize_kernel_name(best));

    std::printf("| shape | type | dequantize ns/element, one thread, into %s: ", dt.c_str());
    for (io::DequantizeKernel k : kernels) std::printf("%s / ", io::dequantize_kernel_name(k));
    std::printf("|\n|---|---|---|\n");
    for (const Shape& s : kShapes) {
      if (!vm["only"].as<std::string>().empty() && std::string(s.what).find(vm["only"].as<std::string>()) == std::string::npos)
        continue;
      for (io::DType t : types) {
        const nn::QuantizedWeight w = random_weight(t, s.out, s.in, rng);
        at::Tensor dst = at::empty({s.out, s.in}, dtype);
        std::vector<std::vector<double>> times(kernels.size());
        for (int r = 0; r < repeat; ++r)
          for (size_t k = 0; k < kernels.size(); ++k) {
            io::set_dequantize_kernel(kernels[k]);
            const auto t0 = Clock::now();
            const uint8_t* src = w.runs[0].bytes.data_ptr<uint8_t>();
            if (dtype == at::kFloat) io::dequantize_rows(t, src, s.out, s.in, dst.data_ptr<float>(), s.in);
            else io::dequantize_rows_bf16(t, src, s.out, s.in, reinterpret_cast<uint16_t*>(dst.data_ptr<at::BFloat16>()), s.in);
            times[k].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          }
        io::set_dequantize_kernel(best);
        std::printf("| %s | %s | ", s.what, io::dtype_name(t));
        for (size_t k = 0; k < kernels.size(); ++k)
          std::printf("%.2f%s", median(times[k]) * 1e9 / static_cast<double>(s.out * s.in), k + 1 < kernels.size() ? " / " : "");
        std::printf(" |\n");
      }
    }

    std::printf("\n| shape | type | tokens | dense ms | panels ms | whole ms | panels / dense | whole / dense |\n"
                "|---|---|---|---|---|---|---|---|\n");
    for (const Shape& s : kShapes) {
      if (!vm["only"].as<std::string>().empty() && std::string(s.what).find(vm["only"].as<std::string>()) == std::string::npos)
        continue;
      for (io::DType t : types) {
        const nn::QuantizedWeight w = random_weight(t, s.out, s.in, rng);
        const at::Tensor dense = w.dequantize(dtype);
        const at::Tensor bias = at::randn({s.out}, dtype);
        for (int64_t m : tokens) {
          const at::Tensor x = at::randn({1, m, s.in}, dtype);
          std::vector<double> td, tp, tw;
          auto time = [](const std::function<at::Tensor()>& f) {
            const auto t0 = Clock::now();
            f();
            return std::chrono::duration<double>(Clock::now() - t0).count();
          };
          for (int r = 0; r < repeat; ++r) {
            td.push_back(time([&] { return at::linear(x, dense, bias); }));
            nn::set_quantized_panels(true);
            tp.push_back(time([&] { return nn::quantized_linear(x, w, bias); }));
            nn::set_quantized_panels(false);
            tw.push_back(time([&] { return nn::quantized_linear(x, w, bias); }));
            nn::set_quantized_panels(true);
          }
          const double d = median(td), p = median(tp), wh = median(tw);
          std::printf("| %s | %s | %lld | %.2f | %.2f | %.2f | %.2f | %.2f |\n", s.what, io::dtype_name(t),
                      static_cast<long long>(m), d * 1e3, p * 1e3, wh * 1e3, p / d, wh / d);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fluxmpi-bench-gguf-linear: %s\n", e.what());
    return 1;
  }
  return 0;
}
