#include "io/dequantize.h"

#include <cstring>

#include "core/error.h"

namespace fluxmpi::io {
namespace {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float half_value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf, nan
  if (exp != 0) return float_of(sign | ((exp + 112) << 23) | (mant << 13));
  // Zero and subnormals: mant * 2^-24, exact in float.
  const float v = static_cast<float>(mant) * float_of(0x33800000u);
  return sign ? -v : v;
}

// Round to nearest even, as torch's float -> half conversion (c10::Half): overflow to infinity.
inline uint16_t half_bits(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536: infinity
  if (a < 0x38800000u) {
    // A half subnormal: adding 0.5 puts the value's bits where a half subnormal's are, and the
    // float addition rounds to nearest even at exactly the half's last place.
    const float t = float_of(a) + 0.5f;
    return static_cast<uint16_t>(sign | (bits_of(t) - 0x3f000000u));
  }
  const uint32_t odd = (a >> 13) & 1u;
  a += 0xc8000fffu + odd;  // exponent re-biased (-112 << 23) and rounded to nearest even
  return static_cast<uint16_t>(sign | (a >> 13));
}

// A float rounded to the nearest fp16 value: what torch's fp16 arithmetic leaves after each op.
inline float h(float x) { return half_value(half_bits(x)); }

inline float f16_at(const uint8_t* p) { return half_value(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// Each block function writes one block's elements to y.

void q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int i = 0; i < 32; ++i) y[i] = h(d * static_cast<float>(static_cast<int8_t>(b[2 + i])));
}

void q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = h(d * static_cast<float>((qs[i] & 0x0f) - 8));
    y[i + 16] = h(d * static_cast<float>((qs[i] >> 4) - 8));
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    y[i] = h(h(d * static_cast<float>(qs[i] & 0x0f)) + m);
    y[i + 16] = h(h(d * static_cast<float>(qs[i] >> 4)) + m);
  }
}

inline uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

void q5_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint32_t qh = u32_at(b + 2);
  const uint8_t* qs = b + 6;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 0x0f) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int hi = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    y[i] = h(d * static_cast<float>(lo - 16));
    y[i + 16] = h(d * static_cast<float>(hi - 16));
  }
}

void q5_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  const uint8_t* qs = b + 8;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 0x0f) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int hi = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    y[i] = h(h(d * static_cast<float>(lo)) + m);
    y[i + 16] = h(h(d * static_cast<float>(hi)) + m);
  }
}

// Q2_K: scales[16] (low nibble: scale, high nibble: min), qs[64] (2-bit codes), d, dmin.
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int j = 0; j < 2; ++j)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int flat = j * 128 + s * 32 + l, group = flat / 16;
        const float dl = h(d * static_cast<float>(scales[group] & 0x0f));
        const float ml = h(dmin * static_cast<float>(scales[group] >> 4));
        const int q = (qs[32 * j + l] >> (2 * s)) & 3;
        y[flat] = h(h(dl * static_cast<float>(q)) - ml);
      }
}

// Q3_K: hmask[32], qs[64], scales[12] (sixteen 6-bit scales), d.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = f16_at(b + 108);
  float dl[16];
  for (int i = 0; i < 16; ++i) {
    const int low = (i < 8 ? sc[i] : sc[i - 8] >> 4) & 0x0f;
    const int high = (sc[8 + (i % 4)] >> (2 * (i / 4))) & 0x03;
    dl[i] = h(d * static_cast<float>((low | (high << 4)) - 32));
  }
  for (int j = 0; j < 2; ++j)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int flat = j * 128 + s * 32 + l;
        const int low = (qs[32 * j + l] >> (2 * s)) & 3;
        const int hbit = ((hmask[l] >> (flat / 32)) & 1) ^ 1;
        y[flat] = h(dl[flat / 16] * static_cast<float>(low - (hbit << 2)));
      }
}

// The eight 6-bit scales and mins of Q4_K and Q5_K, packed in 12 bytes.
void scale_min_k4(const uint8_t* s, int sc[8], int mn[8]) {
  for (int i = 0; i < 4; ++i) {
    sc[i] = s[i] & 0x3f;
    mn[i] = s[4 + i] & 0x3f;
    sc[4 + i] = (s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30);
    mn[4 + i] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
  }
}

void q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  int sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (int g = 0; g < 8; ++g) {
    const float dg = h(d * static_cast<float>(sc[g])), mg = h(dmin * static_cast<float>(mn[g]));
    const int j = g / 2, shift = 4 * (g % 2);
    for (int l = 0; l < 32; ++l) y[32 * g + l] = h(h(dg * static_cast<float>((qs[32 * j + l] >> shift) & 0x0f)) - mg);
  }
}

void q5_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  int sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int g = 0; g < 8; ++g) {
    const float dg = h(d * static_cast<float>(sc[g])), mg = h(dmin * static_cast<float>(mn[g]));
    const int j = g / 2, shift = 4 * (g % 2);
    for (int l = 0; l < 32; ++l) {
      const int q = ((qs[32 * j + l] >> shift) & 0x0f) | (((qh[l] >> g) & 1) << 4);
      y[32 * g + l] = h(h(dg * static_cast<float>(q)) - mg);
    }
  }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d.
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  float dg[16];
  for (int i = 0; i < 16; ++i) dg[i] = h(d * static_cast<float>(scales[i]));
  for (int j = 0; j < 2; ++j)
    for (int s = 0; s < 2; ++s)
      for (int l = 0; l < 64; ++l) {
        const int flat = j * 128 + s * 64 + l;
        const int low = (ql[64 * j + l] >> (4 * s)) & 0x0f;
        // qh: element flat = j*128 + t*32 + m reads bits 2t of qh[32j + m].
        const int t = (flat % 128) / 32, m = flat % 32;
        const int high = (qh[32 * j + m] >> (2 * t)) & 3;
        y[flat] = h(dg[flat / 16] * static_cast<float>((low | (high << 4)) - 32));
      }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(DType t) {
  switch (t) {
    case DType::Q8_0: return q8_0;
    case DType::Q4_0: return q4_0;
    case DType::Q4_1: return q4_1;
    case DType::Q5_0: return q5_0;
    case DType::Q5_1: return q5_1;
    case DType::Q2_K: return q2_k;
    case DType::Q3_K: return q3_k;
    case DType::Q4_K: return q4_k;
    case DType::Q5_K: return q5_k;
    case DType::Q6_K: return q6_k;
    default: return nullptr;
  }
}

}  // namespace

float half_to_float(uint16_t v) { return half_value(v); }
uint16_t float_to_half(float f) { return half_bits(f); }

uint64_t row_bytes(DType dtype, int64_t cols) {
  const uint64_t block = block_elements(dtype);
  FLUX_CHECK(cols >= 0 && static_cast<uint64_t>(cols) % block == 0, "a row of ", cols, " elements is not whole ",
             dtype_name(dtype), " blocks of ", block);
  return static_cast<uint64_t>(cols) / block * block_bytes(dtype);
}

void dequantize_rows(DType dtype, const uint8_t* src, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  const uint64_t stride = row_bytes(dtype, cols);
  if (BlockFn fn = block_fn(dtype)) {
    const int64_t per_block = static_cast<int64_t>(block_elements(dtype));
    const uint64_t bytes = block_bytes(dtype);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = src + static_cast<uint64_t>(r) * stride;
      float* out = dst + r * ld;
      for (int64_t b = 0; b < cols / per_block; ++b) fn(row + static_cast<uint64_t>(b) * bytes, out + b * per_block);
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = src + static_cast<uint64_t>(r) * stride;
    float* out = dst + r * ld;
    switch (dtype) {
      case DType::F32:
        std::memcpy(out, row, static_cast<size_t>(cols) * 4);
        break;
      case DType::F16:
        for (int64_t i = 0; i < cols; ++i) out[i] = f16_at(row + 2 * i);
        break;
      case DType::BF16:
        for (int64_t i = 0; i < cols; ++i)
          out[i] = float_of(static_cast<uint32_t>(row[2 * i] | (row[2 * i + 1] << 8)) << 16);
        break;
      default:
        throw InternalError(str_cat("cannot dequantize dtype ", dtype_name(dtype)));
    }
  }
}

}  // namespace fluxmpi::io
