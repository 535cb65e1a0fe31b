// fluxmpi-bench-controlnet: what a ControlNet adds to one denoising step, in one process.
//
//   fluxmpi-bench-controlnet --model DIR [--cn-double 1 --cn-single 2 --cn-modes 0] [--height 512 --width 512]
//                            [--msl 256] [--threads N] [--repeat R] [--dtype fp32|bf16] [--save-controlnet DIR]
//
// Builds the model folder's transformer (its weights) and a FluxControlNetModel of the same width
// with `--cn-double` double and `--cn-single` single blocks (a Union model with --cn-modes > 0)
// with random weights, on random inputs of one image, and times, taking turns R times after a
// warm-up: (1) the plain step's transformer forward; (2) the ControlNet step: the ControlNet's
// forward (the control image embedded once, as the step loop does) and the transformer forward
// with its residuals. Prints the best of each, their ratio and the peak RSS, and one line
// `bench-result {json}` for tools/bench/peer/controlnet_peer.py. --save-controlnet DIR also writes
// the random ControlNet as a diffusers folder (config.json + fp32 safetensors), for whole runs of
// `fluxmpi --controlnet DIR` (the memory check of docs/performance.md).
#include <boost/program_options.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/units.h"
#include "io/model_dir.h"
#include "models/common/init.h"
#include "models/flux/controlnet.h"
#include "models/flux/latents.h"
#include "models/flux/transformer.h"
#include "parallel/device.h"

namespace po = boost::program_options;
using namespace fluxmpi;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int run(int argc, char** argv) {
  std::string model_dir, dtype_name = "fp32", save_dir;
  int64_t cn_double = 1, cn_single = 2, cn_modes = 0, height = 512, width = 512, msl = 256;
  int threads = 1, repeat = 5;
  po::options_description opts("fluxmpi-bench-controlnet");
  opts.add_options()("model", po::value(&model_dir)->required(), "pipeline folder (its transformer)")(
      "cn-double", po::value(&cn_double)->default_value(1), "ControlNet double blocks")(
      "cn-single", po::value(&cn_single)->default_value(2), "ControlNet single blocks")(
      "cn-modes", po::value(&cn_modes)->default_value(0), "Union control modes (0: not a Union model)")(
      "height", po::value(&height)->default_value(512), "image height")("width", po::value(&width)->default_value(512),
                                                                           "image width")(
      "msl", po::value(&msl)->default_value(256), "text tokens")("threads", po::value(&threads)->default_value(1), "threads")(
      "repeat", po::value(&repeat)->default_value(5), "timed rounds")("save-controlnet", po::value(&save_dir),
                                                                     "also write the ControlNet to this folder")("dtype", po::value(&dtype_name)->default_value("fp32"),
                                                                     "fp32 | bf16");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, opts), vm);
  po::notify(vm);
  if (threads < 1 || repeat < 1) throw UsageError("--threads and --repeat must be positive");
  const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
  parallel::apply_threads(threads);
  c10::InferenceMode guard;

  io::ModelDir dir(model_dir);
  const io::TransformerConfig& tc = dir.transformer_config();
  flux::FluxTransformer model = flux::load_flux_transformer(dir, flux::TransformerPart::whole(tc), dtype, at::kCPU);
  io::ControlNetConfig cc;
  cc.num_layers = cn_double;
  cc.num_single_layers = cn_single;
  cc.attention_head_dim = tc.attention_head_dim;
  cc.num_attention_heads = tc.num_attention_heads;
  cc.joint_attention_dim = tc.joint_attention_dim;
  cc.pooled_projection_dim = tc.pooled_projection_dim;
  cc.guidance_embeds = tc.guidance_embeds;
  cc.axes_dims_rope = tc.axes_dims_rope;
  if (cn_modes > 0) cc.num_mode = cn_modes;
  io::check_controlnet_fits(cc, tc, dir.vae_config().scale_factor(), "the benchmark's ControlNet");
  flux::FluxControlNet net(cc);
  nn::fill_random(*net, 7);
  if (!save_dir.empty())
    nn::save_component(save_dir, io::to_json(cc), *net, "diffusion_pytorch_model", io::DType::F32);
  nn::cast_parameters(*net, dtype);
  net->fuse_projections();
  const io::ResidualLayout layout = io::merged_layout({&cc});

  const flux::LatentGeometry g = flux::latent_geometry(height, width, dir.vae_config().scale_factor(), tc.latent_channels());
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const int64_t L = g.tokens();
  flux::TransformerInputs in;
  in.latents = at::randn({1, L, tc.in_channels}, gen).to(dtype);
  in.text = at::randn({1, msl, tc.joint_attention_dim}, gen).to(dtype);
  in.pooled = at::randn({1, tc.pooled_projection_dim}, gen).to(dtype);
  in.timestep = at::full({1}, 0.5, at::kFloat).to(dtype);
  if (tc.guidance_embeds) in.guidance = at::full({1}, 3.5, at::kFloat);
  const at::Tensor txt_ids = flux::text_position_ids(msl), img_ids = flux::image_position_ids(g.latent_height, g.latent_width);
  const flux::RopeTables rope = model->rope(txt_ids, img_ids), cn_rope = net->rope(txt_ids, img_ids);
  const at::Tensor condition = net->embed_condition(at::randn({1, L, tc.in_channels}, gen).to(dtype));

  auto plain = [&] {
    flux::StreamState s = model->embed(in);
    model->run_blocks(s, rope);
    return model->final_layer(s);
  };
  double cn_only = std::numeric_limits<double>::infinity();
  auto controlled = [&] {
    const Clock::time_point t0 = Clock::now();
    flux::ControlNetInputs ci{in.latents, condition, cn_modes > 0 ? at::zeros({1}, at::kLong) : at::Tensor(), in.text,
                              in.pooled, in.timestep, in.guidance};
    flux::StreamState c = net->embed(ci);
    const std::vector<at::Tensor> samples = net->run_blocks(c, cn_rope, 0.8);
    cn_only = std::min(cn_only, seconds_since(t0));
    flux::BlockResiduals residuals;
    for (int64_t b = 0; b < tc.num_blocks(); ++b) {
      const int64_t k = layout.sample_of_block(b, tc);
      residuals.push_back(k < 0 ? at::Tensor() : samples[static_cast<size_t>(k)]);
    }
    flux::StreamState s = model->embed(in);
    model->run_blocks(s, rope, {}, nullptr, &residuals);
    return model->final_layer(s);
  };
  plain();  // warm-up
  controlled();
  cn_only = std::numeric_limits<double>::infinity();
  double best_plain = std::numeric_limits<double>::infinity(), best_cn = best_plain;
  for (int i = 0; i < repeat; ++i) {
    for (int k = 0; k < 2; ++k) {
      const bool cn_turn = (k == 0) == (i % 2 == 1);  // the order alternates round by round
      const Clock::time_point t0 = Clock::now();
      if (cn_turn) controlled();
      else plain();
      const double t = seconds_since(t0);
      (cn_turn ? best_cn : best_plain) = std::min(cn_turn ? best_cn : best_plain, t);
    }
  }
  std::printf("%lldx%lld (%lld image tokens, %lld text), %s, %d threads; ControlNet %lld double + %lld single blocks%s\n",
              static_cast<long long>(g.height), static_cast<long long>(g.width), static_cast<long long>(L),
              static_cast<long long>(msl), dtype_name.c_str(), threads, static_cast<long long>(cn_double),
              static_cast<long long>(cn_single), cn_modes > 0 ? " (Union)" : "");
  std::printf("plain step %.2f ms, ControlNet step %.2f ms (ControlNet %.2f ms): %.3fx; peak RSS %s\n", best_plain * 1e3,
              best_cn * 1e3, cn_only * 1e3, best_cn / best_plain, format_bytes(peak_rss_bytes()).c_str());
  std::printf("bench-result {\"plain_s\": %.6f, \"controlnet_s\": %.6f, \"controlnet_only_s\": %.6f}\n", best_plain,
              best_cn, cn_only);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const po::error& e) {
    std::fprintf(stderr, "fluxmpi-bench-controlnet: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "fluxmpi-bench-controlnet: %s: %s\n", e.kind(), e.what());
    return e.exit_code();
  }
}
