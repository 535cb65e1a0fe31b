#pragma once
/// The two 8-bit float formats of safetensors files, decoded exactly (every value of both formats
/// is a float32, and a bf16 or fp16 too). libtorch 1.13 has no float8 type, so the loader decodes
/// them itself while copying out of the mapped file.
///   F8_E4M3 (float8_e4m3fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities,
///     0x7F / 0xFF are NaN, largest finite 448, smallest subnormal 2^-9.
///   F8_E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: exponent 31 is
///     infinity (mantissa 0) or NaN; largest finite 57344, smallest subnormal 2^-16.

#include <cstddef>
#include <cstdint>

namespace fluxmpi::io {

float f8_e4m3_to_float(uint8_t code);
float f8_e5m2_to_float(uint8_t code);

/// Decodes n codes into `out` (tables of 256 values, built once).
void decode_f8_e4m3(const uint8_t* codes, size_t n, float* out);
void decode_f8_e5m2(const uint8_t* codes, size_t n, float* out);

}  // namespace fluxmpi::io
