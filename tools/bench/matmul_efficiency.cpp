// fluxmpi-bench-matmul: how close the transformer forward comes to the machine's matmul peak.
//
//   fluxmpi-bench-matmul (--model DIR | --config FILE [--double N --single M --heads H --head-dim D])
//                        [--height 256 --width 256 --msl 128] [--dtype fp32|bf16[,...]] [--threads N]
//                        [--device cpu|cuda] [--repeat R] [--profile] [--patches P]
//
// --model times the pipeline folder's transformer with its weights; --config builds the
// transformer of a config.json (e.g. the real FLUX.1-dev one) with random weights made directly in
// the run dtype, so that any shape can be timed without weight files (--double/--single/--heads/
// --head-dim override the config's numbers). For each dtype it measures (1) at::linear at the shape
// of a single block's fused projection ([tokens x D] x [7D x D]^T: the peak a forward can reach),
// (2) whole forwards of one image, whose FLOPs are the stage planner's count, and prints ms per
// forward, GFLOP/s, the share of the matmul peak and the peak memory. Several dtypes take turns
// in one process, and the matmul and the forward alternate, so that a slow spell of a shared
// machine hits all alike; each keeps its best time. --profile adds a table of where one forward's
// time goes (with --patches, also one pipelined step's), per libtorch operator (the operators
// called by fluxmpi's code, each with everything it calls), from RecordFunction callbacks in an
// extra forward that is not timed. --patches P
// also times one pipelined step of P patches as `fluxmpi --patches P` runs it on one rank (each
// patch embedded, through every block with the key/value caches an exact step filled, then the
// final layer; a new timestep each time, so the modulation is computed once per step): the unit
// costs the schedule model's calibration fits (tools/sim/calibrate.py).
#include <ATen/record_function.h>
#include <boost/program_options.hpp>
#include <c10/core/InferenceMode.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "io/configs.h"
#include "io/json_config.h"
#include "io/model_dir.h"
#include "models/common/attention.h"
#include "models/common/block_reuse.h"
#include "models/common/cpu_linear.h"
#include "models/common/tensor_utils.h"
#include "models/flux/latents.h"
#include "models/flux/transformer.h"
#include "parallel/device.h"
#include "parallel/partition.h"
#include "pipeline/denoise.h"
#include "op_profile.h"

namespace po = boost::program_options;
using namespace fluxmpi;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time of the whole process (all its threads): with --threads 1 the forward's own work, which a
// busy machine disturbs much less than the wall-clock time.
double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// VmHWM / VmRSS of this process in bytes (0 where /proc is missing).
int64_t status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;
  return 0;
}
// Restarts VmHWM at the current RSS (Linux: "5" into clear_refs).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// FLUX.1 gives the first (index) rope axis 1/8 of the head and the two spatial axes the rest (the
// rule of make-tiny-model, pipeline/tiny_model.cpp, which this tool does not link).
std::vector<int64_t> rope_axes_for(int64_t head_dim) {
  if (head_dim % 2 != 0 || head_dim < 6) throw UsageError(str_cat("--head-dim must be even and >= 6, got ", head_dim));
  const int64_t first = std::max<int64_t>(2, head_dim / 8 / 2 * 2), rest = head_dim - first, second = rest / 2 / 2 * 2;
  return {first, second, rest - second};
}

// Random parameters in `dtype` on `device`, one tensor at a time (never a float32 copy of the
// model): matrices N(0, 1/sqrt(fan_in)), biases N(0, 0.05), 1-D scales 1 + N(0, 0.1), as
// nn::fill_random draws them.
void fill_random_in(torch::nn::Module& module, at::ScalarType dtype, at::Device device, uint64_t seed) {
  at::NoGradGuard no_grad;
  at::manual_seed(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  for (auto& item : module.named_parameters(true)) {
    at::Tensor& p = item.value();
    const std::string& name = item.key();
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    at::Tensor v = at::randn(p.sizes(), f32);
    if (is_bias) v.mul_(0.05);
    else if (p.dim() == 1) v.mul_(0.1).add_(1.0);
    else v.mul_(1.0 / std::sqrt(static_cast<double>(p.numel() / p.size(0))));
    p.set_data(v.to(dtype));
  }
}

void synchronize(at::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

using bench::OpProfile;

struct Measured {
  double gemm_s = 1e30, fwd_s = 1e30, fwd_cpu_s = 1e30, patched_s = 1e30;
};

// One step of `fluxmpi --patches P` on one rank (pipeline/denoise.cpp's units): patch p holds its
// image rows (the text with patch 0), sits at its offset in the sequence and reads every block's
// cached keys and values, which `fill_caches` wrote as the exact warm-up step does.
class PatchedStep {
 public:
  PatchedStep(const flux::FluxTransformerImpl& t, flux::TransformerInputs in, flux::RopeTables rope,
              const flux::LatentGeometry& g, int64_t text_tokens, int64_t patches)
      : t_(t), in_(std::move(in)), rope_(std::move(rope)), text_(text_tokens),
        ranges_(pipeline::patch_ranges(g.latent_height / 2, g.latent_width / 2, patches, text_tokens)) {
    kv_ = t_.kv_caches(1, text_ + g.tokens(), in_.latents.options());
  }

  void fill_caches(double timestep) {
    for (flux::KvCache& c : kv_) c.offset = 0;
    flux::StreamState s = t_.embed(at_timestep(in_, timestep));
    t_.run_blocks(s, rope_, {}, &kv_);
    t_.final_layer(s);
  }

  void run(double timestep) {
    const flux::TransformerInputs whole = at_timestep(in_, timestep);
    for (size_t p = 0; p < ranges_.size(); ++p) {
      const pipeline::TokenRange& r = ranges_[p];
      flux::TransformerInputs u = whole;
      u.latents = whole.latents.narrow(1, r.first, r.count).contiguous();
      if (p > 0) u.text = whole.text.narrow(1, 0, 0);
      const int64_t offset = p == 0 ? 0 : text_ + r.first, tokens = (p == 0 ? text_ : 0) + r.count;
      for (flux::KvCache& c : kv_) c.offset = offset;
      flux::StreamState s = t_.embed(u);
      t_.run_blocks(s, {rope_.cos.narrow(0, offset, tokens), rope_.sin.narrow(0, offset, tokens)}, {}, &kv_);
      t_.final_layer(s);
    }
  }

 private:
  static flux::TransformerInputs at_timestep(const flux::TransformerInputs& in, double timestep) {
    flux::TransformerInputs t = in;
    t.timestep = at::full_like(in.timestep, timestep);
    return t;
  }

  const flux::FluxTransformerImpl& t_;
  flux::TransformerInputs in_;
  flux::RopeTables rope_;
  int64_t text_;
  std::vector<pipeline::TokenRange> ranges_;
  std::vector<flux::KvCache> kv_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model, config_path, dtype_list = "fp32", device_name = "cpu";
    int64_t height = 256, width = 256, msl = 128, vae_scale = 8;
    int threads = 1, repeat = 5;
    int64_t patches = 1;
    std::string linear = "onednn";
    uint64_t seed = 0;
    bool profile = false;
    po::options_description opts("fluxmpi-bench-matmul");
    opts.add_options()("model", po::value(&model), "pipeline folder (its transformer weights)")(
        "config", po::value(&config_path), "a transformer config.json: random weights in the run dtype, no files")(
        "double", po::value<int64_t>(), "with --config: double blocks (default: the config's)")(
        "single", po::value<int64_t>(), "with --config: single blocks (default: the config's)")(
        "heads", po::value<int64_t>(), "with --config: attention heads")("head-dim", po::value<int64_t>(),
                                                                          "with --config: attention head dim")(
        "vae-scale", po::value(&vae_scale)->default_value(8), "with --config: VAE scale factor (pixels per latent)")(
        "height", po::value(&height)->default_value(256), "image height")("width", po::value(&width)->default_value(256), "image width")(
        "msl", po::value(&msl)->default_value(128), "text tokens")(
        "dtype", po::value(&dtype_list)->default_value("fp32"), "fp32 | bf16, or a comma list: the dtypes take turns")(
        "device", po::value(&device_name)->default_value("cpu"), "cpu | cuda")(
        "threads", po::value(&threads)->default_value(1), "threads")(
        "repeat", po::value(&repeat)->default_value(5), "rounds of (3 matmuls, 1 forward) per dtype; the best time of each is kept")(
        "seed", po::value(&seed)->default_value(0), "seed of the random weights and inputs")(
        "profile", po::bool_switch(&profile), "print where one forward's time goes, per operator")(
        "patches", po::value(&patches)->default_value(1), "also time one pipelined step of this many patches (> 1)")(
        "linear", po::value(&linear)->default_value("onednn"),
        "fp32 CPU linear layers: onednn (fluxmpi's, models/common/cpu_linear.h) | libtorch (at::linear)");
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
    if (model.empty() == config_path.empty()) throw UsageError("give one of --model DIR and --config FILE");
    if (config_path.empty())
      for (const char* k : {"double", "single", "heads", "head-dim"})
        if (vm.count(k)) throw UsageError(str_cat("--", k, " needs --config"));
    if (threads < 1 || repeat < 1) throw UsageError("--threads and --repeat must be positive");
    if (patches < 1) throw UsageError("--patches must be positive");
    if (linear != "onednn" && linear != "libtorch") throw UsageError("--linear must be onednn or libtorch, got " + linear);
    nn::set_onednn_linear(linear == "onednn");
    parallel::apply_threads(threads);
    c10::InferenceMode guard;
    const at::Device device = parallel::select_device(device_name, 0);

    std::vector<at::ScalarType> dtypes;
    {
      std::stringstream in(dtype_list);
      for (std::string d; std::getline(in, d, ',');) dtypes.push_back(nn::parse_dtype(d));
    }

    io::TransformerConfig tc;
    std::optional<io::ModelDir> dir;
    if (!model.empty()) {
      dir.emplace(model);
      tc = dir->transformer_config();
      vae_scale = dir->vae_config().scale_factor();
    } else {
      tc = io::parse_transformer_config(io::ConfigReader::from_file(config_path, config_path));
      if (vm.count("double")) tc.num_layers = vm["double"].as<int64_t>();
      if (vm.count("single")) tc.num_single_layers = vm["single"].as<int64_t>();
      if (vm.count("heads")) tc.num_attention_heads = vm["heads"].as<int64_t>();
      if (vm.count("head-dim")) {
        tc.attention_head_dim = vm["head-dim"].as<int64_t>();
        tc.axes_dims_rope = rope_axes_for(tc.attention_head_dim);
      }
      if (tc.num_layers < 0 || tc.num_single_layers < 0 || tc.num_attention_heads < 1)
        throw UsageError("--double and --single must not be negative, --heads must be positive");
    }
    const flux::LatentGeometry g = flux::latent_geometry(height, width, vae_scale, tc.latent_channels());
    const int64_t tokens = g.tokens() + msl, D = tc.inner_dim();
    if (patches > g.latent_height / 2)
      throw UsageError(str_cat("--patches ", patches, ": the image has only ", g.latent_height / 2, " token rows"));
    parallel::PlanRequest request;
    request.transformer = tc;
    request.image_tokens = g.tokens();
    request.text_tokens = msl;
    request.attention_chunk_bytes = nn::kAttentionChunkBytes;
    const double fwd_flops = parallel::StagePlan::make(request).estimate(0).step_flops;
    const double gemm_flops = 2.0 * tokens * D * 7 * D;

    std::printf("transformer %s: width %lld (%lld x %lld), %lld + %lld blocks; %lld image + %lld text tokens (%lld x %lld); "
                "%s, %d thread(s)\n",
                model.empty() ? (config_path + " (random weights)").c_str() : model.c_str(), static_cast<long long>(D),
                static_cast<long long>(tc.num_attention_heads), static_cast<long long>(tc.attention_head_dim),
                static_cast<long long>(tc.num_layers), static_cast<long long>(tc.num_single_layers),
                static_cast<long long>(g.tokens()), static_cast<long long>(msl), static_cast<long long>(g.height),
                static_cast<long long>(g.width), device_name.c_str(), threads);
    std::fflush(stdout);

    // Activations come from the allocator of fluxmpi's denoising loop (app/runner.cpp).
    nn::ReuseLargeBlocks reuse;
    // Each dtype's model and inputs, built one after the other (peak memory per dtype is the
    // weights of every dtype built so far plus one forward's activations).
    struct Run {
      at::ScalarType dtype;
      flux::FluxTransformer t{nullptr};
      flux::TransformerInputs in;
      at::Tensor x, w, b;
      int64_t param_bytes = 0, peak_rss = 0;
      double build_s = 0;
      Measured m;
      std::unique_ptr<PatchedStep> patched;
    };
    std::vector<Run> runs;
    const at::Tensor txt_ids = flux::text_position_ids(msl).to(device);
    const at::Tensor img_ids = flux::image_position_ids(g.latent_height, g.latent_width).to(device);
    for (at::ScalarType dtype : dtypes) {
      Run r;
      r.dtype = dtype;
      const auto t0 = Clock::now();
      if (dir) {
        r.t = flux::load_flux_transformer(*dir, flux::TransformerPart::whole(tc), dtype, device);
      } else {
        r.t = flux::FluxTransformer(tc, flux::TransformerPart::whole(tc));
        fill_random_in(*r.t, dtype, device, seed);
        r.t->fuse_projections();
      }
      r.build_s = seconds_since(t0);
      for (const auto& p : r.t->parameters()) r.param_bytes += p.numel() * static_cast<int64_t>(p.element_size());
      at::manual_seed(seed + 1);
      const auto o = at::TensorOptions().dtype(dtype).device(device);
      r.in.latents = at::randn({1, g.tokens(), tc.in_channels}, o);
      r.in.text = at::randn({1, msl, tc.joint_attention_dim}, o);
      r.in.pooled = at::randn({1, tc.pooled_projection_dim}, o);
      r.in.timestep = at::full({1}, 0.5, o);
      if (tc.guidance_embeds) r.in.guidance = at::full({1}, 3.5, o);
      r.x = at::randn({tokens, D}, o);
      r.w = at::randn({7 * D, D}, o);
      r.b = at::zeros({7 * D}, o);
      reset_peak_rss();
      r.t->forward(r.in, txt_ids, img_ids);  // warm-up; its peak is the forward's memory
      synchronize(device);
      r.peak_rss = status_bytes("VmHWM:");
      at::linear(r.x, r.w, r.b);
      if (patches > 1) {
        r.patched = std::make_unique<PatchedStep>(*r.t, r.in, r.t->rope(txt_ids, img_ids), g, msl, patches);
      }
      runs.push_back(std::move(r));
    }

    // Everything takes turns: dtype after dtype, matmul and forward.
    for (int i = 0; i < repeat; ++i) {
      for (Run& r : runs) {
        for (int k = 0; k < 3; ++k) {
          const auto t0 = Clock::now();
          at::linear(r.x, r.w, r.b);
          synchronize(device);
          r.m.gemm_s = std::min(r.m.gemm_s, seconds_since(t0));
        }
        const auto t0 = Clock::now();
        const double c0 = process_cpu_seconds();
        r.t->forward(r.in, txt_ids, img_ids);
        synchronize(device);
        r.m.fwd_s = std::min(r.m.fwd_s, seconds_since(t0));
        r.m.fwd_cpu_s = std::min(r.m.fwd_cpu_s, process_cpu_seconds() - c0);
        if (r.patched) {
          // The exact step before it (a warm-up step) fills the caches at another timestep.
          r.patched->fill_caches(0.75 - 0.01 * i);
          synchronize(device);
          const auto p0 = Clock::now();
          r.patched->run(0.7 - 0.01 * i);
          synchronize(device);
          r.m.patched_s = std::min(r.m.patched_s, seconds_since(p0));
        }
      }
    }

    for (const Run& r : runs) {
      const double peak = gemm_flops / r.m.gemm_s;
      std::printf("%s: weights %s (built in %.1f s); peak RSS%s during a forward %s\n", nn::dtype_label(r.dtype),
                  mib(r.param_bytes).c_str(), r.build_s, device.is_cuda() ? "(host only)" : "", mib(r.peak_rss).c_str());
      std::printf("%s: matmul [%lld x %lld] x [%lld x %lld]^T: %.3f ms, %.1f GFLOP/s (the peak)\n", nn::dtype_label(r.dtype),
                  static_cast<long long>(tokens), static_cast<long long>(D), static_cast<long long>(7 * D),
                  static_cast<long long>(D), r.m.gemm_s * 1e3, peak * 1e-9);
      std::printf("%s: transformer forward: %.1f ms, %.2f GFLOP, %.1f GFLOP/s = %.0f %% of the matmul peak; "
                  "CPU time %.1f ms\n",
                  nn::dtype_label(r.dtype), r.m.fwd_s * 1e3, fwd_flops * 1e-9, fwd_flops / r.m.fwd_s * 1e-9,
                  100.0 * (fwd_flops / r.m.fwd_s) / peak, r.m.fwd_cpu_s * 1e3);
      if (r.patched)
        std::printf("%s: patched step (%lld patches): %.1f ms = %.3f of the forward\n", nn::dtype_label(r.dtype),
                    static_cast<long long>(patches), r.m.patched_s * 1e3, r.m.patched_s / r.m.fwd_s);
    }
    std::fflush(stdout);

    if (profile) {
      for (Run& r : runs) {
        OpProfile p;
        const auto t0 = Clock::now();
        p.start();
        r.t->forward(r.in, txt_ids, img_ids);
        synchronize(device);
        p.stop();
        const double total = seconds_since(t0);
        std::printf("\n%s: one profiled forward, %.1f ms (%.1f ms in operators); per top-level operator:\n",
                    nn::dtype_label(r.dtype), total * 1e3, p.counted() * 1e3);
        p.print_table(total);
        if (!r.patched) continue;
        r.patched->fill_caches(0.75);
        synchronize(device);
        const auto q0 = Clock::now();
        p.start();
        r.patched->run(0.7);
        synchronize(device);
        p.stop();
        const double step = seconds_since(q0);
        std::printf("\n%s: one profiled patched step (%lld patches), %.1f ms (%.1f ms in operators):\n",
                    nn::dtype_label(r.dtype), static_cast<long long>(patches), step * 1e3, p.counted() * 1e3);
        p.print_table(step);
      }
    }
    return 0;
  } catch (const po::error& e) {
    std::fprintf(stderr, "fluxmpi-bench-matmul: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    log::report(e);
    return e.exit_code();
  }
}
