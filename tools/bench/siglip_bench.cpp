// fluxmpi-bench-siglip: what FLUX.1 Redux's image side costs on this machine. Builds the SigLIP
// vision encoder and the Redux embedder of a Redux folder's configs (the shipped FLUX.1-Redux-dev
// by default: 413M + 64.5M parameters) with random weights, then times, best of --repeat after a
// warm-up: the processor on an --image-size square random RGB image, the encoder on its pixels and
// the embedder on the encoder's output. tools/bench/redux_bench.py runs it against the Python side.
// With --hollow DIR: memory instead of speed. Writes (once) DIR as a Redux folder of the configs
// with hollow weights in --weights-dtype (real names and shapes, the data a file hole), then runs
// rank 0's Redux stage as fluxmpi does (pipeline::ReduxEncoder: the loader, one image) and prints
// the process's peak RSS against the plan's estimate for the stage (runtime baseline included).

#include <ATen/Parallel.h>
#include <boost/program_options.hpp>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "io/redux_dir.h"
#include "io/safetensors_writer.h"
#include "parallel/encode_memory.h"
#include "parallel/partition.h"
#include "pipeline/redux_stage.h"
#include "models/common/attention.h"
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

// The Redux folder `redux` (configs) as `dir` with hollow weights of every key fluxmpi reads (and
// the encoder's head, which it skips).
void write_hollow(const std::string& redux, const std::string& dir, io::DType dtype) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / "image_encoder" / "model.safetensors")) return;
  fs::create_directories(dir);
  fs::copy(redux, dir, fs::copy_options::recursive | fs::copy_options::skip_existing);
  const io::ReduxDir r(redux);
  io::SafetensorsWriter enc, emb;
  for (const auto& p : siglip::SiglipVisionModel(r.encoder_config())->named_parameters())
    enc.add_hollow(p.key(), dtype, p.value().sizes().vec());
  const int64_t D = r.encoder_config().hidden_size;
  enc.add_hollow("vision_model.head.attention.in_proj_weight", dtype, {3 * D, D});
  enc.write((fs::path(dir) / "image_encoder" / "model.safetensors").string());
  for (const auto& p : siglip::ReduxImageEncoder(r.embedder_config())->named_parameters())
    emb.add_hollow(p.key(), dtype, p.value().sizes().vec());
  emb.write((fs::path(dir) / "image_embedder" / "diffusion_pytorch_model.safetensors").string());
}

}  // namespace

int main(int argc, char** argv) {
  std::string redux = std::string(FLUXMPI_SHARE_DIR) + "/models/FLUX.1-Redux-dev", dtype_name = "fp32";
  std::string hollow, weights_dtype = "bf16", linear = "onednn";
  int threads = 2, repeat = 2, image_size = 512;
  po::options_description opts("fluxmpi-bench-siglip options");
  opts.add_options()("help", "this text")("redux", po::value(&redux), "a FLUX.1 Redux folder (configs are enough)")(
      "dtype", po::value(&dtype_name), "fp32 or bf16 (default fp32)")("threads", po::value(&threads), "threads (default 2)")(
      "repeat", po::value(&repeat), "timed rounds after the warm-up (default 2)")(
      "image-size", po::value(&image_size), "side of the random input image (default 512)")(
      "hollow", po::value(&hollow), "memory mode: this folder as a hollow Redux folder, loaded as fluxmpi loads it")(
      "weights-dtype", po::value(&weights_dtype), "with --hollow: the weights' dtype on disk (default bf16)")(
      "linear", po::value(&linear), "onednn (default) or libtorch: the fp32 linear layers' GEMM (cpu_linear.h)");
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
    nn::set_onednn_linear(linear != "libtorch");
    if (!hollow.empty()) {
      write_hollow(redux, hollow, weights_dtype == "fp32" ? io::DType::F32 : io::DType::BF16);
      const io::ReduxDir dir(hollow);
      io::Image8 image{image_size, image_size, 3, std::vector<uint8_t>(static_cast<size_t>(image_size) * image_size * 3, 7)};
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t load_peak = 0;
      {
        const pipeline::ReduxEncoder encoder(dir, dtype, at::kCPU);
        load_peak = peak_rss_bytes();
        encoder.encode({image});
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const parallel::EncodeStage stage = parallel::redux_encode_stage(
          dir.encoder_config(), dir.embedder_config(), 1, static_cast<int64_t>(c10::elementSize(dtype)), nn::kAttentionChunkBytes);
      const uint64_t plan = parallel::kRuntimeBaselineBytes + stage.total();
      const uint64_t peak = peak_rss_bytes();
      std::printf("libtorch %s, %s (weights %s on disk), %d threads: Redux stage %.1f s\n", TORCH_VERSION,
                  dtype_name.c_str(), weights_dtype.c_str(), threads, s);
      std::printf("peak rss after loading: %s\n", format_bytes(load_peak).c_str());
      std::printf("peak rss: %s; plan: %s (runtime %s + weights %s + activations %s); measured / plan %.3f\n",
                  format_bytes(peak).c_str(), format_bytes(plan).c_str(), format_bytes(parallel::kRuntimeBaselineBytes).c_str(),
                  format_bytes(stage.weight_bytes).c_str(), format_bytes(stage.activation_bytes).c_str(),
                  static_cast<double>(peak) / static_cast<double>(plan));
      return 0;
    }
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
