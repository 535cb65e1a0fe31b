#include "models/common/layers.h"

#include <ATen/ATen.h>

#include "core/error.h"

#include "models/common/cpu_linear.h"
#include "models/common/quantized_linear.h"
#include "models/common/tensor_utils.h"
#include "models/common/winograd_conv.h"

namespace fluxmpi::nn {

at::Tensor placeholder(at::IntArrayRef shape) { return at::empty(shape, at::TensorOptions().dtype(at::kFloat)); }

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias) : in_features(in), out_features(out) {
  weight = register_parameter("weight", placeholder({out, in}), false);
  if (with_bias) bias = register_parameter("bias", placeholder({out}), false);
}

at::Tensor LinearImpl::forward(const at::Tensor& x) const {
  if (quantized) return quantized_linear(x, *quantized, bias);
  return nn::linear(x, weight, bias);
}

void LinearImpl::set_quantized(std::shared_ptr<const QuantizedWeight> w) {
  FLUX_CHECK(w && w->runs.size() == 1 && w->out_features() == out_features && w->in_features == in_features,
             "quantized weight of the wrong shape for a linear [", out_features, ", ", in_features, "]");
  at::NoGradGuard no_grad;
  weight.set_data(w->runs.front().bytes);
  quantized = std::move(w);
}

at::Tensor linear(const at::Tensor& x, const FusedLinear& f) {
  if (f.quantized) return quantized_linear(x, *f.quantized, f.bias);
  return nn::linear(x, f.weight, f.bias);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", placeholder({dim}), false);
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) const {
  at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor y = x * at::rsqrt(variance + eps);
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) y = y.to(weight.scalar_type());
  return y * weight;
}

LayerNormImpl::LayerNormImpl(int64_t dim_, double eps_, bool affine) : dim(dim_), eps(eps_) {
  if (affine) {
    weight = register_parameter("weight", placeholder({dim}), false);
    bias = register_parameter("bias", placeholder({dim}), false);
  }
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) const { return at::layer_norm(x, {dim}, weight, bias, eps); }

GroupNormImpl::GroupNormImpl(int64_t groups_, int64_t channels, double eps_) : groups(groups_), eps(eps_) {
  weight = register_parameter("weight", placeholder({channels}), false);
  bias = register_parameter("bias", placeholder({channels}), false);
}

at::Tensor GroupNormImpl::forward(const at::Tensor& x) const { return at::group_norm(x, groups, weight, bias, eps); }

Conv2dImpl::Conv2dImpl(int64_t in, int64_t out, int64_t kernel) : padding(kernel / 2) {
  weight = register_parameter("weight", placeholder({out, in, kernel, kernel}), false);
  bias = register_parameter("bias", placeholder({out}), false);
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) const {
  return conv2d(x, weight, bias, /*stride=*/{1, 1}, /*padding=*/{padding, padding});
}

at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                  at::IntArrayRef padding) {
  const at::ScalarType dtype = x.scalar_type();
  if (weight.dim() == 4 && weight.size(2) == 3 && weight.size(3) == 3 && stride.size() == 2 && stride[0] == 1 &&
      stride[1] == 1 && padding.size() == 2 && padding[0] == 1 && padding[1] == 1 && winograd_applies(x, weight))
    return winograd_conv3x3(x, weight, bias);
  if (x.is_cpu() && !cpu_conv_sums_in_fp32(dtype)) {
    const at::Tensor b = bias.defined() ? bias.to(at::kFloat) : bias;
    return at::conv2d(x.to(at::kFloat), weight.to(at::kFloat), b, stride, padding).to(dtype);
  }
  return at::conv2d(x, weight, bias, stride, padding);
}

EmbeddingImpl::EmbeddingImpl(int64_t num, int64_t dim) {
  weight = register_parameter("weight", placeholder({num, dim}), false);
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

FusedLinear fuse_linears(const std::vector<Linear>& parts) {
  at::NoGradGuard no_grad;
  size_t quantized = 0;
  for (const auto& l : parts) quantized += l->quantized ? 1 : 0;
  if (quantized != 0 && quantized != parts.size()) return {};
  const bool with_bias = parts.front()->bias.defined();
  FusedLinear fused;
  std::vector<at::Tensor> ws, bs;
  std::vector<std::shared_ptr<const QuantizedWeight>> qs;
  for (const auto& l : parts) {
    FLUX_CHECK(l->bias.defined() == with_bias, "fused linears with and without bias");
    if (with_bias) bs.push_back(l->bias);
    if (quantized) qs.push_back(l->quantized);
    else ws.push_back(l->weight);
  }
  if (with_bias) fused.bias = at::cat(bs, 0);
  if (quantized) fused.quantized = concat_quantized(qs);
  else fused.weight = gemm_layout_cat(ws);
  int64_t offset = 0;
  for (const auto& l : parts) {
    if (!quantized) l->weight.set_data(fused.weight.narrow(0, offset, l->out_features));
    if (with_bias) l->bias.set_data(fused.bias.narrow(0, offset, l->out_features));
    offset += l->out_features;
  }
  return fused;
}

at::Tensor gelu_tanh(const at::Tensor& x) { return at::gelu(x, "tanh"); }

at::Tensor quick_gelu(const at::Tensor& x) { return x * at::sigmoid(1.702 * x); }

}  // namespace fluxmpi::nn
