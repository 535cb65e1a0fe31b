#pragma once
/// The linear layers' products in float32 on the CPU through oneDNN's multi-threaded GEMM.
///
/// For the shapes of the transformers (hundreds to thousands of tokens, widths 512-3072 and
/// their 3-12x projections) oneDNN's sgemm with the weight read as a row-major [in, out] matrix
/// is 7-13 % faster than libtorch's at::linear (both Debian 12's libtorch 1.13 and Debian 13's
/// 2.6; docs/performance.md). So a model's fp32 CPU weights are kept transposed in memory
/// (`gemm_layout`: the same [out, in] tensor, stored [in, out]), which `linear` hands to that GEMM
/// without a copy. Everything else (another dtype or device, a weight in the usual layout, no
/// oneDNN in the process, a call inside a parallel region) is at::linear, so the layout is
/// always safe to read through libtorch.

#include <ATen/ATen.h>

#include <vector>

namespace torch::nn {
class Module;
}

namespace fluxmpi::nn {

/// x [..., in] times weight [out, in] transposed, plus bias [out] when defined: at::linear's result.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// `w` ([out, in]) stored transposed when `linear` would hand it to oneDNN (float32 on the CPU with
/// oneDNN's GEMM in the process); else `w` itself.
at::Tensor gemm_layout(const at::Tensor& w);

/// at::cat(weights, 0) in gemm_layout, written there directly (no concatenated copy in the usual
/// layout first): the weights of linears that read the same input, fused (nn::fuse_linears).
at::Tensor gemm_layout_cat(const std::vector<at::Tensor>& weights);

/// Every nn::Linear of `module` (its own and its children's) in gemm_layout.
void use_gemm_layout(torch::nn::Module& module);

/// Benchmarks: false makes `linear` at::linear everywhere and `gemm_layout` keep the usual layout
/// (libtorch's own path, as before nn::linear, for models built after the call).
void set_onednn_linear(bool on);

}  // namespace fluxmpi::nn
