#pragma once
/// Dequantization of GGUF block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K) and of the
/// 16-bit float types into float32, value for value as diffusers' GGUF path computes them
/// (diffusers/quantizers/gguf/utils.py, v0.40, torch ports of city96's dequant.py): every block
/// scale is an fp16 number, and each product or sum of the formula is rounded to fp16 where torch's
/// fp16 arithmetic rounds it (fp16 x integer codes -> fp16; fp16 +/- fp16 -> computed in float,
/// then rounded to fp16), so the results are exact fp16 values, equal bit for bit to diffusers'
/// dequantized weights before their cast to the compute dtype. Torch-free (fuzzable, sanitized).

#include <cstdint>

#include "io/safetensors.h"

namespace fluxmpi::io {

/// Bytes of one row of `cols` elements stored in `dtype` (cols must be whole blocks).
uint64_t row_bytes(DType dtype, int64_t cols);

/// Rows [0, rows) of `cols` elements each, stored in `dtype` one after the other from `src`, as
/// float32 into dst (row r at dst + r * ld). Types: F32, F16, BF16 and the block types of
/// io::is_quantized. InternalError for another dtype or cols not a whole number of blocks.
void dequantize_rows(DType dtype, const uint8_t* src, int64_t rows, int64_t cols, float* dst, int64_t ld);

/// As dequantize_rows, each value then rounded to bfloat16 as torch casts float to bfloat16 (to
/// nearest even): the bits of a bf16 tensor, diffusers' dequantized weight cast to bf16.
void dequantize_rows_bf16(DType dtype, const uint8_t* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld);

/// How the block types are dequantized: portable C++ (Scalar), or with the CPU's fp16 conversions
/// over 8 (Avx2: AVX2 + F16C) or 16 (Avx512: AVX-512F) values at a time. Every kernel gives the
/// same values bit for bit; the best one the CPU supports is used unless a test or benchmark sets
/// another.
enum class DequantizeKernel { Scalar, Avx2, Avx512 };
bool dequantize_kernel_supported(DequantizeKernel kernel);
DequantizeKernel dequantize_kernel();
/// InternalError for a kernel this CPU or build does not support.
void set_dequantize_kernel(DequantizeKernel kernel);
const char* dequantize_kernel_name(DequantizeKernel kernel);

/// fp16 <-> float32 with IEEE round-to-nearest-even, float32 -> bfloat16 as c10::BFloat16 (exposed
/// for the tests).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
uint16_t float_to_bf16(float f);

}  // namespace fluxmpi::io
