// fluxmpi-bench-matmul: how close the transformer forward comes to the machine's matmul peak.
//   fluxmpi-bench-matmul --model DIR [--height 256 --width 256 --msl 128] [--dtype fp32|bf16] [--threads N]
// Measures (1) the GFLOP/s of at::linear at the model's widest projection shape (the peak a
// forward can reach), (2) one whole transformer forward of one image, whose FLOPs come from the
// stage planner's count, and prints both and their ratio.
#include <boost/program_options.hpp>

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "core/log.h"
#include "parallel/device.h"
#include "parallel/partition.h"
#include "io/model_dir.h"
#include "models/common/attention.h"
#include "models/common/tensor_utils.h"
#include "models/flux/latents.h"
#include "models/flux/transformer.h"

namespace po = boost::program_options;
using namespace fluxmpi;

namespace {
template <typename F>
double best_seconds(int repeat, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    std::string model, dtype_name = "fp32";
    int64_t height = 256, width = 256, msl = 128;
    int threads = 1, repeat = 3;
    po::options_description opts("fluxmpi-bench-matmul");
    opts.add_options()("model", po::value(&model)->required(), "pipeline folder")(
        "height", po::value(&height)->default_value(256), "image height")("width", po::value(&width)->default_value(256), "image width")(
        "msl", po::value(&msl)->default_value(128), "text tokens")("dtype", po::value(&dtype_name)->default_value("fp32"), "fp32 | bf16")(
        "threads", po::value(&threads)->default_value(1), "threads")("repeat", po::value(&repeat)->default_value(5), "rounds of (3 matmuls, 1 forward); the best time of each is kept");
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
    parallel::apply_threads(threads);
    c10::InferenceMode guard;
    const at::ScalarType dtype = nn::parse_dtype(dtype_name);
    io::ModelDir dir(model);
    const io::TransformerConfig& tc = dir.transformer_config();
    const flux::LatentGeometry g = flux::latent_geometry(height, width, dir.vae_config().scale_factor(), tc.latent_channels());
    const int64_t tokens = g.tokens() + msl, D = tc.inner_dim();

    // (1) the matmul peak at the shape of a single block's fused projection (D -> 3D + 4D).
    at::Tensor x = at::randn({tokens, D}).to(dtype), w = at::randn({7 * D, D}).to(dtype), b = at::zeros({7 * D}).to(dtype);
    const double gemm_flops = 2.0 * tokens * D * 7 * D;

    // (2) a whole forward of one image.
    flux::FluxTransformer t = flux::load_flux_transformer(dir, flux::TransformerPart::whole(tc), dtype, at::kCPU);
    flux::TransformerInputs in;
    in.latents = at::randn({1, g.tokens(), tc.in_channels}).to(dtype);
    in.text = at::randn({1, msl, tc.joint_attention_dim}).to(dtype);
    in.pooled = at::randn({1, tc.pooled_projection_dim}).to(dtype);
    in.timestep = at::full({1}, 0.5f).to(dtype);
    if (tc.guidance_embeds) in.guidance = at::full({1}, 3.5f);
    at::Tensor txt_ids = flux::text_position_ids(msl), img_ids = flux::image_position_ids(g.latent_height, g.latent_width);
    t->forward(in, txt_ids, img_ids);  // warm-up
    at::linear(x, w, b);
    // The two take turns, so that a slow spell of a shared machine hits both alike; each keeps
    // its best time.
    double gemm_s = 1e30, fwd_s = 1e30;
    for (int i = 0; i < repeat; ++i) {
      gemm_s = std::min(gemm_s, best_seconds(3, [&] { at::linear(x, w, b); }));
      fwd_s = std::min(fwd_s, best_seconds(1, [&] { t->forward(in, txt_ids, img_ids); }));
    }
    parallel::PlanRequest request;
    request.transformer = tc;
    request.image_tokens = g.tokens();
    request.text_tokens = msl;
    request.attention_chunk_bytes = nn::kAttentionChunkBytes;
    const double fwd_flops = parallel::StagePlan::make(request).estimate(0).step_flops;

    std::printf("model %s: width %lld, %lld + %lld blocks; %lld image + %lld text tokens; %s, %d thread(s)\n", model.c_str(),
                static_cast<long long>(D), static_cast<long long>(tc.num_layers), static_cast<long long>(tc.num_single_layers),
                static_cast<long long>(g.tokens()), static_cast<long long>(msl), dtype_name.c_str(), threads);
    std::printf("matmul [%lld x %lld] x [%lld x %lld]^T: %.3f ms, %.1f GFLOP/s (the peak)\n", static_cast<long long>(tokens),
                static_cast<long long>(D), static_cast<long long>(7 * D), static_cast<long long>(D), gemm_s * 1e3,
                gemm_flops / gemm_s * 1e-9);
    std::printf("transformer forward: %.1f ms, %.2f GFLOP, %.1f GFLOP/s = %.0f %% of the matmul peak\n", fwd_s * 1e3,
                fwd_flops * 1e-9, fwd_flops / fwd_s * 1e-9, 100.0 * (fwd_flops / fwd_s) / (gemm_flops / gemm_s));
    return 0;
  } catch (const po::error& e) {
    std::fprintf(stderr, "fluxmpi-bench-matmul: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    log::report(e);
    return e.exit_code();
  }
}
