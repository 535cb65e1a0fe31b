// fluxmpi-bench-t5-load: how much memory loading the T5 encoder takes. The real T5-XXL encoder is
// 9.5 GB in bf16; the loader must hold one copy of the parameters, never a second one. Generates
// (with --generate) a large random T5 v1.1 encoder as sharded safetensors in a pipeline folder,
// then loads it once per requested dtype, each in a fresh process so that every peak RSS belongs
// to one load alone, and prints peak RSS against the parameter bytes.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <boost/program_options.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "io/model_dir.h"
#include "io/safetensors_writer.h"
#include "models/common/loader.h"
#include "models/common/tensor_utils.h"
#include "models/t5_encoder.h"

extern char** environ;

namespace fluxmpi {
namespace {
namespace fs = std::filesystem;
namespace po = boost::program_options;

struct Sizes {
  int64_t d_model, d_ff, layers, heads, d_kv, vocab;
};

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out) throw IoError(str_cat("cannot write '", path.string(), "'"));
}

io::T5Config t5_config(const Sizes& s) {
  io::T5Config c;
  c.vocab_size = s.vocab;
  c.d_model = s.d_model;
  c.d_kv = s.d_kv;
  c.d_ff = s.d_ff;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.gated = true;
  c.act = "gelu_new";
  return c;
}

/// A pipeline folder holding only text_encoder_2/: config.json, one shard per block (plus one for
/// the embedding and final norm) and the index, all with random weights of the file dtype.
void generate(const fs::path& root, const Sizes& s, io::DType file_dtype, uint64_t seed) {
  const fs::path dir = root / "text_encoder_2";
  if (fs::exists(dir)) throw UsageError(str_cat("'", dir.string(), "' exists: remove it or drop --generate"));
  fs::create_directories(dir);
  write_text(root / "model_index.json", R"({"_class_name": "FluxPipeline"})");
  nlohmann::ordered_json cfg = {{"architectures", {"T5EncoderModel"}}, {"d_model", s.d_model},  {"d_ff", s.d_ff},
                                {"d_kv", s.d_kv},   {"num_heads", s.heads},   {"num_layers", s.layers},
                                {"vocab_size", s.vocab}, {"feed_forward_proj", "gated-gelu"},
                                {"relative_attention_num_buckets", 32}, {"relative_attention_max_distance", 128},
                                {"layer_norm_epsilon", 1e-6}, {"model_type", "t5"}};
  write_text(dir / "config.json", cfg.dump(2));

  // The module only names the parameters and their shapes: its placeholders are never touched.
  text_models::T5EncoderModel model(t5_config(s));
  const at::ScalarType st = file_dtype == io::DType::BF16 ? at::kBFloat16
                            : file_dtype == io::DType::F16 ? at::kHalf : at::kFloat;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // Parameters come in module order: shared, the blocks, the final norm (kept with the last block).
  const int64_t shards = s.layers + 1;
  auto shard_of = [&](const std::string& key) -> int64_t {
    const std::string prefix = "encoder.block.";
    if (key == "shared.weight") return 0;
    if (key.rfind(prefix, 0) != 0) return shards - 1;
    return 1 + std::stoll(key.substr(prefix.size()));
  };
  std::vector<io::SafetensorsWriter> writers(1);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total = 0;
  int64_t current = 0;
  auto name = [&](int64_t i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05lld-of-%05lld.safetensors", static_cast<long long>(i + 1),
                  static_cast<long long>(shards));
    return std::string(buf);
  };
  auto flush = [&]() {
    total += writers.back().data_bytes();
    writers.back().write((dir / name(current)).string());
    writers.back() = io::SafetensorsWriter();
  };
  for (const auto& p : model->named_parameters()) {
    int64_t shard = shard_of(p.key());
    if (shard != current) {
      flush();
      current = shard;
    }
    at::Tensor value;
    if (p.value().dim() == 1) {
      value = at::ones(p.value().sizes());
    } else {
      value = at::normal(0.0, 1.0 / std::sqrt(static_cast<double>(p.value().size(1))), p.value().sizes(), gen);
    }
    value = value.to(st).contiguous();
    writers.back().add(p.key(), file_dtype, std::vector<int64_t>(value.sizes().begin(), value.sizes().end()),
                       value.data_ptr(), static_cast<size_t>(value.numel() * value.element_size()));
    weight_map[p.key()] = name(shard);
  }
  flush();
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text(dir / "model.safetensors.index.json", index.dump(2));
}

uint64_t weight_file_bytes(const fs::path& dir) {
  uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") bytes += fs::file_size(e.path());
  return bytes;
}

/// The child: one load in this process, then one line of measurements.
int measure(const std::string& root, const std::string& dtype_name) {
  const at::ScalarType dtype = nn::parse_dtype(dtype_name);
  const uint64_t rss_before = current_rss_bytes();
  const uint64_t peak_before = peak_rss_bytes();
  io::ModelDir dir(root);
  auto start = std::chrono::steady_clock::now();
  text_models::T5EncoderModel model = text_models::load_t5_encoder(dir, dtype, at::kCPU);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t peak_after = peak_rss_bytes();
  const uint64_t rss_after = current_rss_bytes();
  const auto params = static_cast<uint64_t>(nn::parameter_bytes(*model));
  const uint64_t files = weight_file_bytes(fs::path(root) / "text_encoder_2");
  std::printf(
      "load %s: parameters %s (files %s) in %.2f s | RSS before %s (peak %s) | peak after %s, RSS after %s | "
      "peak - RSS before = %s = %.3f x parameters\n",
      nn::dtype_label(dtype), format_bytes(params).c_str(), format_bytes(files).c_str(), seconds,
      format_bytes(rss_before).c_str(), format_bytes(peak_before).c_str(), format_bytes(peak_after).c_str(),
      format_bytes(rss_after).c_str(), format_bytes(peak_after - rss_before).c_str(),
      static_cast<double>(peak_after - rss_before) / static_cast<double>(params));
  std::fflush(stdout);
  return 0;
}

int spawn_measure(const std::string& root, const std::string& dtype, int threads) {
  std::vector<std::string> args = {"fluxmpi-bench-t5-load", "--dir", root, "--measure", dtype, "--threads",
                                   std::to_string(threads)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ); rc != 0)
    throw IoError(str_cat("cannot start the measuring process: ", std::strerror(rc)));
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) throw IoError("waitpid failed");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int run(int argc, char** argv) {
  Sizes s{};
  std::string root, measure_dtype, dtypes, file_dtype;
  uint64_t seed = 0;
  int threads = 0;
  po::options_description opts(
      "fluxmpi-bench-t5-load: peak RSS of loading a large T5 encoder against its parameter bytes\n"
      "usage: fluxmpi-bench-t5-load --dir DIR [--generate [sizes]] [--dtypes bf16,fp32]\nOptions");
  opts.add_options()("help,h", "this help")("dir", po::value(&root)->required(),
                                            "pipeline folder holding text_encoder_2/ (generated with --generate)")(
      "generate", "write a random T5 encoder of the sizes below into DIR first")(
      "d-model", po::value(&s.d_model)->default_value(2048), "")("d-ff", po::value(&s.d_ff)->default_value(5120), "")(
      "layers", po::value(&s.layers)->default_value(12), "")("heads", po::value(&s.heads)->default_value(32), "")(
      "d-kv", po::value(&s.d_kv)->default_value(64), "")("vocab", po::value(&s.vocab)->default_value(32128), "")(
      "file-dtype", po::value(&file_dtype)->default_value("bf16"), "dtype of the generated weights: bf16, fp16, fp32")(
      "seed", po::value(&seed)->default_value(0), "seed of the generated weights")(
      "dtypes", po::value(&dtypes)->default_value("bf16,fp32"), "run dtypes to load with, one process each")(
      "threads", po::value(&threads)->default_value(0), "intra-op threads (0: libtorch's default)")(
      "measure", po::value(&measure_dtype), "internal: load once in this process and print one line");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  if (threads > 0) at::set_num_threads(threads);
  if (!measure_dtype.empty()) return measure(root, measure_dtype);

  if (vm.count("generate")) {
    const io::DType fd = file_dtype == "fp32" ? io::DType::F32 : file_dtype == "fp16" ? io::DType::F16
                         : file_dtype == "bf16" ? io::DType::BF16
                         : throw UsageError(str_cat("--file-dtype must be bf16, fp16 or fp32, got '", file_dtype, "'"));
    auto start = std::chrono::steady_clock::now();
    generate(root, s, fd, seed);
    std::printf("generated %s/text_encoder_2 in %.1f s\n", root.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  io::ModelDir dir(root);
  const io::T5Config& c = dir.t5_config();
  std::printf("T5 encoder %s/text_encoder_2: %lld blocks, d_model %lld, d_ff %lld, %lld heads x %lld, vocab %lld; "
              "weight files %s\n",
              root.c_str(), static_cast<long long>(c.num_layers), static_cast<long long>(c.d_model),
              static_cast<long long>(c.d_ff), static_cast<long long>(c.num_heads), static_cast<long long>(c.d_kv),
              static_cast<long long>(c.vocab_size),
              format_bytes(weight_file_bytes(fs::path(root) / "text_encoder_2")).c_str());
  std::fflush(stdout);
  int rc = 0;
  std::stringstream list(dtypes);
  for (std::string d; std::getline(list, d, ',');) {
    nn::parse_dtype(d);
    rc |= spawn_measure(root, d, threads);
  }
  return rc;
}

}  // namespace
}  // namespace fluxmpi

int main(int argc, char** argv) {
  try {
    return fluxmpi::run(argc, argv);
  } catch (const fluxmpi::Error& e) {
    fluxmpi::log::report(e);
    return e.exit_code();
  }
}
