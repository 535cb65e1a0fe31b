// make-tiny-model: writes a random-weight FLUX pipeline folder in the diffusers layout.
//   make-tiny-model --out demo/tiny-flux [--preset tiny|bench] [--variant dev|schnell] [--seed S]
//                   [--dtype fp32|bf16] [--heads H] [--head-dim D] [--double N] [--single M] [--shards K]
//                   [--vae-channels C,C,...] [--vae-groups G] [--vae-sample-size PIXELS]
#include <boost/program_options.hpp>

#include <iostream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "pipeline/tiny_model.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  using namespace fluxmpi;
  try {
    po::options_description opts("make-tiny-model options");
    std::string out, preset = "tiny";
    opts.add_options()("help,h", "show this help")("out,o", po::value(&out), "pipeline folder to create (required)")(
        "preset", po::value(&preset)->default_value("tiny"), "tiny (the demo) or bench (benchmark model)")(
        "variant", po::value<std::string>(), "dev (guidance embedding) or schnell")(
        "seed", po::value<uint64_t>(), "weights seed")("dtype", po::value<std::string>(), "weights on disk: fp32 or bf16")(
        "heads", po::value<int64_t>(), "attention heads")("head-dim", po::value<int64_t>(), "attention head dim")(
        "double", po::value<int64_t>(), "double-stream blocks")("single", po::value<int64_t>(), "single-stream blocks")(
        "shards", po::value<int64_t>(), "transformer weight files")(
        "vae-channels", po::value<std::string>(), "VAE block_out_channels, e.g. 128,256,512,512 (FLUX.1's real VAE)")(
        "vae-groups", po::value<int64_t>(), "VAE norm_num_groups (FLUX.1: 32)")(
        "vae-sample-size", po::value<int64_t>(), "VAE sample_size: the tile of tiled decoding in pixels (FLUX.1: 1024)")("corpus", po::value<std::string>(), "tokenizer training text");
    po::variables_map vm;
    try {
      po::store(po::parse_command_line(argc, argv, opts), vm);
      po::notify(vm);
    } catch (const po::error& e) {
      throw UsageError(e.what());
    }
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    if (out.empty()) throw UsageError("--out is required");
    pipeline::TinyModelSpec spec = pipeline::tiny_model_preset(preset);
    if (vm.count("variant")) spec.variant = vm["variant"].as<std::string>();
    if (vm.count("seed")) spec.seed = vm["seed"].as<uint64_t>();
    if (vm.count("dtype")) spec.dtype = vm["dtype"].as<std::string>();
    if (vm.count("heads")) spec.heads = vm["heads"].as<int64_t>();
    if (vm.count("head-dim")) spec.head_dim = vm["head-dim"].as<int64_t>();
    if (vm.count("double")) spec.double_blocks = vm["double"].as<int64_t>();
    if (vm.count("single")) spec.single_blocks = vm["single"].as<int64_t>();
    if (vm.count("shards")) spec.shards = vm["shards"].as<int64_t>();
    if (vm.count("corpus")) spec.corpus = vm["corpus"].as<std::string>();
    if (vm.count("vae-channels")) {
      spec.vae_channels.clear();
      std::stringstream list(vm["vae-channels"].as<std::string>());
      for (std::string item; std::getline(list, item, ',');) {
        try {
          spec.vae_channels.push_back(std::stoll(item));
        } catch (const std::exception&) {
          throw UsageError("--vae-channels: expected positive integers separated by commas, got '" + item + "'");
        }
      }
    }
    if (vm.count("vae-groups")) spec.vae_groups = vm["vae-groups"].as<int64_t>();
    if (vm.count("vae-sample-size")) spec.vae_sample_size = vm["vae-sample-size"].as<int64_t>();
    if (spec.vae_sample_size < 1) throw UsageError("--vae-sample-size must be positive");
    for (int64_t ch : spec.vae_channels)
      if (ch < 1 || ch % spec.vae_groups != 0)
        throw UsageError("--vae-channels: each must be a positive multiple of --vae-groups (" + std::to_string(spec.vae_groups) + ")");
    for (int64_t v : {spec.heads, spec.head_dim, spec.shards})
      if (v < 1) throw UsageError("--heads, --head-dim and --shards must be positive");
    if (spec.double_blocks < 0 || spec.single_blocks < 0 || spec.double_blocks + spec.single_blocks < 1)
      throw UsageError("--double and --single must be >= 0 and not both 0");
    pipeline::write_tiny_model(out, spec);
    return 0;
  } catch (const Error& e) {
    log::report(e);
    return e.exit_code();
  }
}
