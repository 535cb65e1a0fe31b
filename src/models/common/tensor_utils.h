#pragma once
/// dtype and device helpers, and the bridge from mapped safetensors data to torch tensors.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "io/tensor_store.h"

namespace fluxmpi::nn {

/// "fp32" | "bf16" | "fp16" (also "float32", "bfloat16", "float16") -> ScalarType; UsageError otherwise.
at::ScalarType parse_dtype(const std::string& text);
/// fp32 | bf16 | fp16
const char* dtype_label(at::ScalarType dtype);

/// Whether this libtorch can run matmuls in `dtype` on `device` (libtorch 1.13 has no fp16
/// matmul on CPU). Probed once per (dtype, device type).
bool dtype_supported(at::ScalarType dtype, at::Device device);

/// Whether libtorch's CPU convolution in `dtype` (bf16, fp16) sums its products in fp32. It does
/// through oneDNN, which libtorch 1.13 takes for bf16 only on CPUs with AVX-512 (BW, VL, DQ) and
/// with oneDNN switched on; its own fallback kernel sums in the 16-bit type, losing about 40x
/// the accuracy on a 3x3 convolution of 128 channels (docs/architecture.md, "Numerics").
/// Probed on a 4096-term sum (a bf16 running total stops at 256, fp16 at 2048); fp32 is always true. The
/// answer follows at::globalContext().userEnabledMkldnn() (tests switch oneDNN off).
bool cpu_conv_sums_in_fp32(at::ScalarType dtype);

/// A torch tensor over the mapped bytes of `view` (no copy when the data is aligned for its
/// dtype; an aligned copy otherwise). Valid while the store keeps the shard mapped. Only for a
/// tensor stored as is in a dtype libtorch has (copy_view handles every tensor).
at::Tensor borrow(const io::TensorView& view);
/// Copies the tensor `view` presents into `dst` (contiguous, of the presented shape, any dtype
/// and device): piece by piece along dim 0, float8 codes decoded exactly on the way. Nothing of
/// the size of the tensor is allocated besides `dst`.
void copy_view(const io::TensorView& view, at::Tensor& dst);
/// The tensor converted to `dtype` on `device`: one copy, made directly from the mapping.
at::Tensor read_tensor(const io::TensorStore& store, const std::string& key, at::ScalarType dtype, at::Device device);

/// "[3072, 64]"
std::string shape_string(at::IntArrayRef shape);
std::string shape_string(const std::vector<int64_t>& shape);

/// Throws InternalError "<what>: expected shape [..] got [..]" unless `t` has `dims` dimensions
/// and, where `expected[i]` >= 0, that size.
void check_shape(const at::Tensor& t, const std::vector<int64_t>& expected, const char* what);

}  // namespace fluxmpi::nn
