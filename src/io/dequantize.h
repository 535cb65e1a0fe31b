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

/// fp16 <-> float32 with IEEE round-to-nearest-even (exposed for the tests).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

}  // namespace fluxmpi::io
