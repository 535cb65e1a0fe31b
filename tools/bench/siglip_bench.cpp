// fluxmpi-bench-siglip: what FLUX.1 Redux's image side costs on this machine. Builds the SigLIP
// vision encoder and the Redux embedder of a Redux folder's configs (the shipped FLUX.1-Redux-dev
// by default: 413M + 64.5M parameters) with random weights, then times, best of --repeat after a
// warm-up: the processor on an --image-size square random RGB image, the encoder on its pixels and
// the embedder on the encoder's output. tools/bench/redux_bench.py runs it against the Python side.

#include <ATen/Parallel.h>
#include <boost/program_options.hpp>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "io/redux_dir.h"
#include "models/common/cpu_linear.h"
#include "models/common/init.h"
#include "models/siglip/redux_embedder.h"
#include "models/siglip/siglip_processor.h"
#include "models/siglip/siglip_vision.h"

namespace po = boost::program_options;
using namespace fluxmpi;

namespace {

double best_ms(int repeat, const std::function<void()>& f) {
  f();  // warm-up
  double best = 1e300;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string redux = std::string(FLUXMPI_SHARE_DIR) + "/models/FLUX.1-Redux-dev", dtype_name = "fp32";
  int threads = 2, repeat = 2, image_size = 512;
  po::options_description opts("fluxmpi-bench-siglip options");
  opts.add_options()("help", "this text")("redux", po::value(&redux), "a FLUX.1 Redux folder (configs are enough)")(
      "dtype", po::value(&dtype_name), "fp32 or bf16 (default fp32)")("threads", po::value(&threads), "threads (default 2)")(
      "repeat", po::value(&repeat), "timed rounds after the warm-up (default 2)")(
      "image-size", po::value(&image_size), "side of the random input image (default 512)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::ostringstream os;
      os << opts;
      std::printf("%s", os.str().c_str());
      return 0;
    }
    FLUX_CHECK_AS(UsageError, dtype_name == "fp32" || dtype_name == "bf16", "--dtype: fp32 or bf16, not '", dtype_name, "'");
    const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
    at::set_num_threads(threads);
    const io::ReduxDir dir(redux);
    siglip::SiglipVisionModel enc(dir.encoder_config());
    siglip::ReduxImageEncoder emb(dir.embedder_config());
    nn::fill_random(*enc, 1);
    nn::fill_random(*emb, 2);
    nn::cast_parameters(*enc, dtype);
    nn::cast_parameters(*emb, dtype);
    nn::use_gemm_layout(*enc);  // as the loaders leave them
    nn::use_gemm_layout(*emb);
    c10::InferenceMode guard;
    at::manual_seed(0);
    io::Image8 image{image_size, image_size, 3, {}};
    const at::Tensor noise = at::randint(0, 256, {image_size * image_size * 3}, at::kByte);
    image.pixels.assign(noise.data_ptr<uint8_t>(), noise.data_ptr<uint8_t>() + noise.numel());
    at::Tensor pixels, hidden;
    const double proc_ms = best_ms(repeat, [&] { pixels = siglip::siglip_preprocess(image, dir.processor_config()).pixel_values; });
    const double enc_ms = best_ms(repeat, [&] { hidden = enc->forward(pixels).last_hidden_state; });
    const double emb_ms = best_ms(repeat, [&] { emb->forward(hidden); });
    std::printf("libtorch %s, %s, %d threads, best of %d; %lld image tokens, encoder %.1fM + embedder %.1fM parameters\n",
                TORCH_VERSION, dtype_name.c_str(), threads, repeat, static_cast<long long>(hidden.size(1)),
                dir.encoder_config().parameters() / 1e6,
                dir.embedder_config().parameters() / 1e6);
    std::printf("siglip processor: %.2f ms\nsiglip encoder: %.1f ms\nredux embedder: %.1f ms\npeak rss: %s\n", proc_ms,
                enc_ms, emb_ms, format_bytes(static_cast<int64_t>(peak_rss_bytes())).c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "fluxmpi-bench-siglip: %s: %s\n", e.kind(), e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fluxmpi-bench-siglip: %s\n", e.what());
    return 2;
  }
  return 0;
}
