#include "io/float8.h"

#include <array>
#include <cmath>
#include <limits>

namespace fluxmpi::io {

namespace {

// sign | exponent (E bits, bias B) | mantissa (M bits). Subnormals at exponent 0.
float decode(uint8_t code, int exponent_bits, int mantissa_bits, int bias) {
  const bool negative = (code & 0x80) != 0;
  const int mantissa = code & ((1 << mantissa_bits) - 1);
  const int exponent = (code >> mantissa_bits) & ((1 << exponent_bits) - 1);
  float magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), 1 - bias - mantissa_bits);
  else
    magnitude = std::ldexp(static_cast<float>((1 << mantissa_bits) + mantissa), exponent - bias - mantissa_bits);
  return negative ? -magnitude : magnitude;
}

std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    // e4m3fn spends only the all-ones pattern on NaN; exponent 15 is otherwise a normal binade.
    t[c] = (c & 0x7F) == 0x7F ? std::numeric_limits<float>::quiet_NaN() : decode(static_cast<uint8_t>(c), 4, 3, 7);
  }
  return t;
}

std::array<float, 256> make_e5m2_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int exponent = (c >> 2) & 0x1F;
    if (exponent == 0x1F) {
      const float inf = std::numeric_limits<float>::infinity();
      t[c] = (c & 0x3) != 0 ? std::numeric_limits<float>::quiet_NaN() : ((c & 0x80) ? -inf : inf);
    } else {
      t[c] = decode(static_cast<uint8_t>(c), 5, 2, 15);
    }
  }
  return t;
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = make_e4m3_table();
  return table;
}

const std::array<float, 256>& e5m2_table() {
  static const std::array<float, 256> table = make_e5m2_table();
  return table;
}

}  // namespace

float f8_e4m3_to_float(uint8_t code) { return e4m3_table()[code]; }
float f8_e5m2_to_float(uint8_t code) { return e5m2_table()[code]; }

void decode_f8_e4m3(const uint8_t* codes, size_t n, float* out) {
  const auto& t = e4m3_table();
  for (size_t i = 0; i < n; ++i) out[i] = t[codes[i]];
}

void decode_f8_e5m2(const uint8_t* codes, size_t n, float* out) {
  const auto& t = e5m2_table();
  for (size_t i = 0; i < n; ++i) out[i] = t[codes[i]];
}

}  // namespace fluxmpi::io
