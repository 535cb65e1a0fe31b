#pragma once
/// Linear layers whose weights stay quantized in memory (GGUF block types, io/gguf.h) and are
/// dequantized at compute time, as diffusers' GGUFLinear does (dequantize the weight, cast it to the
/// compute dtype, F.linear): a rank then holds about its slice's file bytes, not the dense weights.
///
/// Semantics of diffusers' GGUFLinear.forward_native (v0.40): W = dequantize(bytes) as exact fp16
/// values (io/dequantize.h), cast to x's dtype, then x W^T + b. On the CPU the weight is never
/// expanded whole: its rows are dequantized a panel at a time (a few MiB, in parallel) and each
/// panel's columns of the output are one GEMM (the same products and sums per output element as one
/// GEMM over the whole weight, in another order of the blocks: float rounding apart, the same
/// numbers); the panel buffer is the only extra memory. On other devices the weight is dequantized
/// on the CPU and copied over for each call (correct, not fast).

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "io/safetensors.h"

namespace fluxmpi::nn {

/// A weight [out_features, in_features] stored as rows of quantization blocks: runs of rows of one
/// dtype each (a fused projection joins its parts' runs without copying them).
struct QuantizedWeight {
  struct Run {
    io::DType dtype = io::DType::Q8_0;
    at::Tensor bytes;  ///< [rows, row bytes] uint8, on the CPU
    int64_t rows() const { return bytes.size(0); }
  };
  std::vector<Run> runs;
  int64_t in_features = 0;

  int64_t out_features() const;
  /// Bytes held (what the weight costs in memory).
  int64_t bytes() const;
  /// Rows [begin, end) as float32 into dst (row stride ld).
  void dequantize_rows(int64_t begin, int64_t end, float* dst, int64_t ld) const;
  /// The whole weight as a dense [out, in] tensor of `dtype` on the CPU (tests, other devices).
  at::Tensor dequantize(at::ScalarType dtype) const;
  /// "Q8_0" or "Q4_K+Q6_K".
  std::string dtype_text() const;
};

/// The runs of `parts`, in order, as one weight (their in_features must agree).
std::shared_ptr<const QuantizedWeight> concat_quantized(const std::vector<std::shared_ptr<const QuantizedWeight>>& parts);

/// x [..., in] times the dequantized weight transposed, plus bias [out] when defined, in x's dtype.
at::Tensor quantized_linear(const at::Tensor& x, const QuantizedWeight& weight, const at::Tensor& bias);

/// The working memory of one quantized_linear call on the CPU over `tokens` rows of `in_features`
/// (the smallest input width of a model's quantized layers gives the largest panel), an upper
/// bound: the dequantized panel (float32 then cast for an fp16 run; the run dtype directly for
/// float32 and bf16, counted as float32 plus the run dtype all the same) and the panel's columns of
/// the output.
uint64_t quantized_scratch_bytes(int64_t tokens, int64_t in_features, int64_t dtype_bytes);

/// Benchmarks: false dequantizes the whole weight and calls at::linear once (diffusers' way),
/// true (default) goes panel by panel (docs/performance.md, "GGUF").
void set_quantized_panels(bool on);

}  // namespace fluxmpi::nn
