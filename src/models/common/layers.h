#pragma once
/// Small libtorch modules with diffusers/transformers parameter names. Parameters are created
/// uninitialised (float32, CPU, untouched so they cost no memory) and replaced by the loader with
/// tensors of the run dtype and device; models that need values without a file (tests,
/// make-tiny-model) fill them explicitly.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <utility>
#include <vector>

namespace fluxmpi::nn {

struct QuantizedWeight;

/// y = x W^T + b. Parameters: weight [out, in], bias [out]. A weight loaded from a GGUF block type
/// stays quantized (models/common/quantized_linear.h): `quantized` holds it, and the registered
/// `weight` is then its bytes ([out, row bytes] uint8), so names and memory accounting stay true.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias = true);
  at::Tensor forward(const at::Tensor& x) const;
  /// Keeps `w` ([out_features, in_features], one run of rows) as this layer's weight.
  void set_quantized(std::shared_ptr<const QuantizedWeight> w);
  at::Tensor weight;
  at::Tensor bias;  ///< undefined without bias
  std::shared_ptr<const QuantizedWeight> quantized;  ///< set: the weight is quantized
  int64_t in_features, out_features;
};
TORCH_MODULE(Linear);

/// Several linears that read the same input as one: a dense weight, or a quantized one (the parts'
/// runs of rows joined), and the joined bias.
struct FusedLinear {
  at::Tensor weight, bias;
  std::shared_ptr<const QuantizedWeight> quantized;
  bool defined() const { return weight.defined() || quantized != nullptr; }
};
/// x times the fused weight transposed, plus the fused bias.
at::Tensor linear(const at::Tensor& x, const FusedLinear& fused);

/// RMS normalisation in float32 with a learned scale, as diffusers' RMSNorm and T5's LayerNorm:
/// x * rsqrt(mean(x^2) + eps), cast to the weight dtype when that is 16-bit, times weight.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

/// LayerNorm over the last dimension; parameters weight/bias only when `affine`.
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps, bool affine);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  int64_t dim;
  double eps;
};
TORCH_MODULE(LayerNorm);

class GroupNormImpl : public torch::nn::Module {
 public:
  GroupNormImpl(int64_t groups, int64_t channels, double eps);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  int64_t groups;
  double eps;
};
TORCH_MODULE(GroupNorm);

/// 2-D convolution, stride 1, square kernel, "same" padding for odd kernels.
class Conv2dImpl : public torch::nn::Module {
 public:
  Conv2dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight, bias;
  int64_t padding;
};
TORCH_MODULE(Conv2d);

/// at::conv2d, but on the CPU in a 16-bit dtype whose libtorch kernel would sum in that dtype
/// (nn::cpu_conv_sums_in_fp32), computed in fp32 and rounded once to the input's dtype; and a 3x3
/// convolution with stride and padding 1 of fp32 or bf16 input by Winograd's F(2x2, 3x3)
/// where nn::winograd_applies (winograd_conv.h).
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::IntArrayRef stride,
                  at::IntArrayRef padding);

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num, int64_t dim);
  at::Tensor forward(const at::Tensor& ids) const;
  at::Tensor weight;
};
TORCH_MODULE(Embedding);

/// Concatenates the weights and biases of linears that read the same input along the output
/// dimension, and re-points each linear's parameters at its slice of the result (no extra memory
/// once the originals are released; names unchanged). Quantized parts are joined by their runs of
/// rows (no copy). Parts of which some are quantized and others not are left apart: the result
/// is then undefined, and the callers run the parts one by one.
FusedLinear fuse_linears(const std::vector<Linear>& parts);

/// GELU with the tanh approximation (diffusers "gelu-approximate", transformers "gelu_new").
at::Tensor gelu_tanh(const at::Tensor& x);
/// x * sigmoid(1.702 x) (CLIP).
at::Tensor quick_gelu(const at::Tensor& x);

/// An uninitialised parameter tensor of `shape`: placeholder until the loader replaces it.
at::Tensor placeholder(at::IntArrayRef shape);

}  // namespace fluxmpi::nn
