#include "models/common/init.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

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

void cast_parameters(torch::nn::Module& module, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (auto& p : module.parameters(true)) p.set_data(p.to(dtype));
}

}  // namespace fluxmpi::nn
