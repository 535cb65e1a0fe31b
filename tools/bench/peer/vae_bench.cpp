// fluxmpi-bench-vae: the VAE decode of one latent, timed, and where its time goes.
//
//   fluxmpi-bench-vae --model DIR [--size 512] [--dtype fp32|bf16[,...]] [--conv winograd|libtorch[,...]]
//                     [--threads N] [--repeat R] [--profile]
//
// Loads the pipeline folder's VAE decoder (as the fluxmpi command does, in each run dtype) and
// decodes a random latent of a --size x --size image: one warm-up, then R timed decodes per dtype
// and kernel set (--conv: winograd, the opt-in Winograd 3x3 convolutions and channels-last group
// norm where they apply, off in fluxmpi by default; libtorch: at::conv2d and at::group_norm
// throughout, as fluxmpi runs the decoder),
// the configurations taking turns; prints the best time and the FLOP rate of the convolutions (the decoder's
// FLOPs are counted from its config: the 3x3 and 1x1 convolutions at each level and the mid-block
// attention). --profile adds one more decode with a per-operator table (time of each top-level
// libtorch operator the decoder calls, with everything it calls; the thread that runs the decode).
#include <ATen/record_function.h>
#include <boost/program_options.hpp>
#include <sys/resource.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "io/model_dir.h"
#include "models/common/tensor_utils.h"
#include "models/common/winograd_conv.h"
#include "models/vae/norm.h"
#include "models/vae/vae_decoder.h"
#include "parallel/device.h"
#include "../op_profile.h"

namespace po = boost::program_options;
using namespace fluxmpi;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds of the process so far, all threads (user + system): on a shared machine it moves
// less than the wall time with the load, though it counts OpenMP's spinning too.
double cpu_seconds(bool system_only = false) {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const double sys = static_cast<double>(u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_stime.tv_usec);
  return system_only ? sys : sys + static_cast<double>(u.ru_utime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec);
}

// FLOPs of one decode of a latent of h x w cells (multiply-adds count 2).
double decoder_flops(const io::VaeConfig& c, int64_t h, int64_t w) {
  const auto conv = [](int64_t cin, int64_t cout, int64_t k, int64_t pixels) {
    return 2.0 * static_cast<double>(cin * cout * k * k) * static_cast<double>(pixels);
  };
  const auto resnet = [&](int64_t cin, int64_t cout, int64_t pixels) {
    return conv(cin, cout, 3, pixels) + conv(cout, cout, 3, pixels) + (cin != cout ? conv(cin, cout, 1, pixels) : 0.0);
  };
  const std::vector<int64_t>& ch = c.block_out_channels;
  int64_t pixels = h * w, previous = ch.back();
  double flops = conv(c.latent_channels, previous, 3, pixels) + 2 * resnet(previous, previous, pixels);
  if (c.mid_block_add_attention)
    flops += 4 * conv(previous, previous, 1, pixels) + 4.0 * static_cast<double>(pixels) * pixels * previous;
  for (size_t i = 0; i < ch.size(); ++i) {
    const int64_t out = ch[ch.size() - 1 - i];
    for (int64_t r = 0; r <= c.layers_per_block; ++r) flops += resnet(r == 0 ? previous : out, out, pixels);
    if (i + 1 < ch.size()) {
      pixels *= 4;
      flops += conv(out, out, 3, pixels);
    }
    previous = out;
  }
  return flops + conv(ch.front(), c.out_channels, 3, pixels);
}

using bench::OpProfile;

void print_profile(const OpProfile& p, double total, const char* dtype) {
  std::printf("\n%s: one profiled decode, %.1f ms; per top-level operator:\n", dtype, total * 1e3);
  p.print_table(total);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model, dtype_list = "fp32", conv_list = "winograd";
    int64_t size = 512;
    int threads = 1, repeat = 2;
    bool profile = false;
    po::options_description opts("fluxmpi-bench-vae");
    opts.add_options()("model", po::value(&model), "pipeline folder (its vae/)")(
        "size", po::value(&size)->default_value(512), "image side in pixels")(
        "dtype", po::value(&dtype_list)->default_value("fp32"), "fp32 | bf16, or a comma list: the dtypes take turns")(
        "conv", po::value(&conv_list)->default_value("winograd"),
        "winograd | libtorch, or a comma list: fluxmpi's VAE kernels or libtorch's (each dtype with each)")(
        "threads", po::value(&threads)->default_value(1), "threads")(
        "repeat", po::value(&repeat)->default_value(2), "timed decodes per dtype after one warm-up; the best is kept")(
        "profile", po::bool_switch(&profile), "print where one decode's time goes, per operator");
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
    if (model.empty()) throw UsageError("--model DIR is required");
    if (threads < 1 || repeat < 1 || size < 8) throw UsageError("--threads and --repeat must be positive, --size >= 8");
    parallel::apply_threads(threads);
    c10::InferenceMode guard;

    io::ModelDir dir(model);
    const io::VaeConfig& config = dir.vae_config();
    const int64_t cells = size / config.scale_factor();
    const double flops = decoder_flops(config, cells, cells);
    std::printf("VAE decoder of %s: block_out_channels", model.c_str());
    for (int64_t c : config.block_out_channels) std::printf(" %lld", static_cast<long long>(c));
    std::printf(", %lld groups; latent %lld x %lld -> %lld x %lld; %.1f GFLOP; %d thread(s)\n",
                static_cast<long long>(config.norm_num_groups), static_cast<long long>(cells),
                static_cast<long long>(cells), static_cast<long long>(cells * config.scale_factor()),
                static_cast<long long>(cells * config.scale_factor()), flops * 1e-9, threads);
    std::fflush(stdout);

    struct Run {
      at::ScalarType dtype;
      bool winograd = true;
      vae::VaeDecoder vae{nullptr};
      std::string label() const { return str_cat(nn::dtype_label(dtype), winograd ? " winograd" : " libtorch"); }
      double best_s = 1e30, best_cpu_s = 1e30, sys_s = 0, warmup_s = 0;
    };
    std::vector<Run> runs;
    {
      std::vector<bool> convs;
      std::stringstream cin(conv_list);
      for (std::string c; std::getline(cin, c, ',');) {
        if (c != "winograd" && c != "libtorch") throw UsageError(str_cat("--conv: '", c, "' is not winograd or libtorch"));
        convs.push_back(c == "winograd");
      }
      std::stringstream in(dtype_list);
      for (std::string d; std::getline(in, d, ',');)
        for (bool w : convs) runs.push_back({nn::parse_dtype(d), w});
    }
    at::manual_seed(0);
    const at::Tensor z = at::randn({1, config.latent_channels, cells, cells});
    for (Run& r : runs) {
      r.vae = vae::load_vae_decoder(dir, r.dtype, at::kCPU);
      nn::set_winograd(r.winograd);
      vae::set_group_norm_nhwc(r.winograd);
      const auto t0 = Clock::now();
      r.vae->forward(z);
      r.warmup_s = seconds_since(t0);
    }
    for (int i = 0; i < repeat; ++i)
      for (Run& r : runs) {
        nn::set_winograd(r.winograd);
        vae::set_group_norm_nhwc(r.winograd);
        const auto t0 = Clock::now();
        const double c0 = cpu_seconds(), s0 = cpu_seconds(true);
        r.vae->forward(z);
        r.best_s = std::min(r.best_s, seconds_since(t0));
        if (cpu_seconds() - c0 < r.best_cpu_s) {
          r.best_cpu_s = cpu_seconds() - c0;
          r.sys_s = cpu_seconds(true) - s0;
        }
      }
    for (const Run& r : runs)
      std::printf("%s: decode %.1f ms (warm-up %.1f ms), %.1f GFLOP/s; %.2f CPU s (%.2f s in the kernel)\n",
                  r.label().c_str(), r.best_s * 1e3, r.warmup_s * 1e3, flops / r.best_s * 1e-9, r.best_cpu_s,
                  r.sys_s);
    std::fflush(stdout);

    if (profile)
      for (const Run& r : runs) {
        nn::set_winograd(r.winograd);
        vae::set_group_norm_nhwc(r.winograd);
        OpProfile p;
        const auto t0 = Clock::now();
        p.start();
        r.vae->forward(z);
        p.stop();
        print_profile(p, seconds_since(t0), r.label().c_str());
      }
    return 0;
  } catch (const po::error& e) {
    std::fprintf(stderr, "fluxmpi-bench-vae: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "fluxmpi-bench-vae: %s\n", e.what());
    return e.exit_code();
  }
}
