#include "models/common/init.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fluxmpi::nn {

void fill_random(torch::nn::Module& module, uint64_t seed, double gain) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& item : module.named_parameters(true)) {
    at::Tensor& p = item.value();
    at::Tensor value;
    const std::string& name = item.key();
    bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (is_bias) {
      value = at::normal(0.0, 0.05, p.sizes(), gen);
    } else if (p.dim() == 1) {
      value = 1.0 + at::normal(0.0, 0.1, p.sizes(), gen);
    } else {
      double fan_in = static_cast<double>(p.numel() / p.size(0));
      value = at::normal(0.0, gain / std::sqrt(fan_in), p.sizes(), gen);
    }
    p.set_data(value.to(at::kFloat));
  }
}

void add_parameters(io::SafetensorsWriter& writer, const torch::nn::Module& module, const std::string& prefix,
                    io::DType dtype) {
  at::ScalarType st = dtype == io::DType::F32 ? at::kFloat : dtype == io::DType::BF16 ? at::kBFloat16
                      : dtype == io::DType::F16 ? at::kHalf : at::kFloat;
  FLUX_CHECK(dtype == io::DType::F32 || dtype == io::DType::BF16 || dtype == io::DType::F16, "unsupported dtype");
  for (const auto& item : module.named_parameters(true)) {
    at::Tensor t = item.value().detach().to(at::kCPU).to(st).contiguous();
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    writer.add(prefix + item.key(), dtype, shape, t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
  }
}

void save_component(const std::string& dir, const std::string& config_json, const torch::nn::Module& module,
                    const std::string& stem, io::DType dtype, int num_shards) {
  namespace fs = std::filesystem;
  FLUX_CHECK(num_shards >= 1, "num_shards must be positive");
  fs::create_directories(dir);
  {
    std::ofstream out(fs::path(dir) / "config.json");
    out << config_json;
    if (!out) throw IoError(str_cat("cannot write '", (fs::path(dir) / "config.json").string(), "'"));
  }
  auto params = module.named_parameters(true);
  const size_t elem = io::dtype_size(dtype);
  int64_t total = 0;
  for (const auto& p : params) total += p.value().numel() * static_cast<int64_t>(elem);
  if (num_shards == 1) {
    io::SafetensorsWriter w;
    add_parameters(w, module, "", dtype);
    w.write((fs::path(dir) / (stem + ".safetensors")).string());
    return;
  }
  // Split in parameter order into shards of about total / num_shards bytes each.
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  const int64_t target = (total + num_shards - 1) / num_shards;
  size_t next = 0;
  for (int k = 1; k <= num_shards; ++k) {
    char name[256];
    std::snprintf(name, sizeof name, "%s-%05d-of-%05d.safetensors", stem.c_str(), k, num_shards);
    io::SafetensorsWriter w;
    int64_t bytes = 0;
    while (next < params.size() && (k == num_shards || bytes < target)) {
      const auto& item = params[next++];
      at::Tensor t = item.value().detach().to(at::kCPU).to(dtype == io::DType::F32 ? at::kFloat
                                                     : dtype == io::DType::BF16 ? at::kBFloat16 : at::kHalf).contiguous();
      std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
      w.add(item.key(), dtype, shape, t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
      weight_map[item.key()] = name;
      bytes += t.numel() * t.element_size();
    }
    w.write((fs::path(dir) / name).string());
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream out(fs::path(dir) / (stem + ".safetensors.index.json"));
  out << index.dump(2);
  if (!out) throw IoError(str_cat("cannot write the index in '", dir, "'"));
}

void cast_parameters(torch::nn::Module& module, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (auto& p : module.parameters(true)) p.set_data(p.to(dtype));
}

}  // namespace fluxmpi::nn
