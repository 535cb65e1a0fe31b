#include "io/dequantize.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLUXMPI_DEQUANTIZE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

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

// --- The vector kernels' form of a block ------------------------------------------------------
//
// Every block type's formula is one of y = h(s * q) or y = h(h(s * q) + c), with q a small
// integer code and s, c one fp16 number per group of 16 or 32 elements (c = m for Q4_1/Q5_1,
// c = -ml for the K types: a - b and a + (-b) are the same IEEE operation). A decoder unpacks a
// block's codes and its groups' s and c (each computed by the scalar h() above, as the block
// functions do); a finisher runs the formula over the codes with the hardware's fp16 conversions
// (F16C / AVX-512: round to nearest even, overflow to infinity, as h()). With finite s and c no
// NaN can arise (|s * q| < 2^24 is exact in float), so the results are those of the scalar block
// functions bit for bit; a block with a non-finite s or c goes through its scalar function.

struct Decoded {
  int8_t q[256];
  float s[16], c[16];
};

struct BlockForm {
  int elements, group;
  bool offset;
  bool (*decode)(const uint8_t* b, Decoded& out);  // false: a non-finite scale (scalar path)
};

bool finite_groups(const Decoded& o, int groups, bool offset) {
  for (int g = 0; g < groups; ++g)
    if (!std::isfinite(o.s[g]) || (offset && !std::isfinite(o.c[g]))) return false;
  return true;
}

bool d_q8_0(const uint8_t* b, Decoded& o) {
  o.s[0] = f16_at(b);
  std::memcpy(o.q, b + 2, 32);
  return finite_groups(o, 1, false);
}

bool d_q4_0(const uint8_t* b, Decoded& o) {
  o.s[0] = f16_at(b);
  for (int i = 0; i < 16; ++i) {
    o.q[i] = static_cast<int8_t>((b[2 + i] & 0x0f) - 8);
    o.q[i + 16] = static_cast<int8_t>((b[2 + i] >> 4) - 8);
  }
  return finite_groups(o, 1, false);
}

bool d_q4_1(const uint8_t* b, Decoded& o) {
  o.s[0] = f16_at(b);
  o.c[0] = f16_at(b + 2);
  for (int i = 0; i < 16; ++i) {
    o.q[i] = static_cast<int8_t>(b[4 + i] & 0x0f);
    o.q[i + 16] = static_cast<int8_t>(b[4 + i] >> 4);
  }
  return finite_groups(o, 1, true);
}

// Q5_0 / Q5_1: the fifth bit of element i is bit i of qh.
void five_bit_codes(const uint8_t* qs, uint32_t qh, int bias, int8_t* q) {
  for (int i = 0; i < 16; ++i) {
    q[i] = static_cast<int8_t>(((qs[i] & 0x0f) | static_cast<int>(((qh >> i) & 1u) << 4)) - bias);
    q[i + 16] = static_cast<int8_t>(((qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4)) - bias);
  }
}

bool d_q5_0(const uint8_t* b, Decoded& o) {
  o.s[0] = f16_at(b);
  five_bit_codes(b + 6, u32_at(b + 2), 16, o.q);
  return finite_groups(o, 1, false);
}

bool d_q5_1(const uint8_t* b, Decoded& o) {
  o.s[0] = f16_at(b);
  o.c[0] = f16_at(b + 2);
  five_bit_codes(b + 8, u32_at(b + 4), 0, o.q);
  return finite_groups(o, 1, true);
}

bool d_q2_k(const uint8_t* b, Decoded& o) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int g = 0; g < 16; ++g) {
    o.s[g] = h(d * static_cast<float>(scales[g] & 0x0f));
    o.c[g] = -h(dmin * static_cast<float>(scales[g] >> 4));
  }
  for (int j = 0; j < 2; ++j)
    for (int sh = 0; sh < 4; ++sh)
      for (int l = 0; l < 32; ++l) o.q[j * 128 + sh * 32 + l] = static_cast<int8_t>((qs[32 * j + l] >> (2 * sh)) & 3);
  return finite_groups(o, 16, true);
}

bool d_q3_k(const uint8_t* b, Decoded& o) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = f16_at(b + 108);
  for (int i = 0; i < 16; ++i) {
    const int low = (i < 8 ? sc[i] : sc[i - 8] >> 4) & 0x0f;
    const int high = (sc[8 + (i % 4)] >> (2 * (i / 4))) & 0x03;
    o.s[i] = h(d * static_cast<float>((low | (high << 4)) - 32));
  }
  for (int j = 0; j < 2; ++j)
    for (int sh = 0; sh < 4; ++sh) {
      const int bit = j * 4 + sh;  // flat / 32
      for (int l = 0; l < 32; ++l)
        o.q[j * 128 + sh * 32 + l] = static_cast<int8_t>(((qs[32 * j + l] >> (2 * sh)) & 3) - ((((hmask[l] >> bit) & 1) ^ 1) << 2));
    }
  return finite_groups(o, 16, false);
}

void k4_scales(const uint8_t* b, Decoded& o) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  int sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  for (int g = 0; g < 8; ++g) {
    o.s[g] = h(d * static_cast<float>(sc[g]));
    o.c[g] = -h(dmin * static_cast<float>(mn[g]));
  }
}

bool d_q4_k(const uint8_t* b, Decoded& o) {
  k4_scales(b, o);
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 4; ++j)
    for (int l = 0; l < 32; ++l) {
      o.q[64 * j + l] = static_cast<int8_t>(qs[32 * j + l] & 0x0f);
      o.q[64 * j + 32 + l] = static_cast<int8_t>(qs[32 * j + l] >> 4);
    }
  return finite_groups(o, 8, true);
}

bool d_q5_k(const uint8_t* b, Decoded& o) {
  k4_scales(b, o);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 4; ++j)
    for (int l = 0; l < 32; ++l) {
      o.q[64 * j + l] = static_cast<int8_t>((qs[32 * j + l] & 0x0f) | (((qh[l] >> (2 * j)) & 1) << 4));
      o.q[64 * j + 32 + l] = static_cast<int8_t>((qs[32 * j + l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4));
    }
  return finite_groups(o, 8, true);
}

bool d_q6_k(const uint8_t* b, Decoded& o) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int i = 0; i < 16; ++i) o.s[i] = h(d * static_cast<float>(scales[i]));
  for (int j = 0; j < 2; ++j)
    for (int t = 0; t < 4; ++t)
      for (int m = 0; m < 32; ++m) {
        const int low = (ql[64 * j + (t % 2) * 32 + m] >> (4 * (t / 2))) & 0x0f;
        const int high = (qh[32 * j + m] >> (2 * t)) & 3;
        o.q[j * 128 + t * 32 + m] = static_cast<int8_t>((low | (high << 4)) - 32);
      }
  return finite_groups(o, 16, false);
}

const BlockForm* block_form(DType t) {
  static const BlockForm q8{32, 32, false, d_q8_0}, q40{32, 32, false, d_q4_0}, q41{32, 32, true, d_q4_1},
      q50{32, 32, false, d_q5_0}, q51{32, 32, true, d_q5_1}, q2k{256, 16, true, d_q2_k}, q3k{256, 16, false, d_q3_k},
      q4k{256, 32, true, d_q4_k}, q5k{256, 32, true, d_q5_k}, q6k{256, 16, false, d_q6_k};
  switch (t) {
    case DType::Q8_0: return &q8;
    case DType::Q4_0: return &q40;
    case DType::Q4_1: return &q41;
    case DType::Q5_0: return &q50;
    case DType::Q5_1: return &q51;
    case DType::Q2_K: return &q2k;
    case DType::Q3_K: return &q3k;
    case DType::Q4_K: return &q4k;
    case DType::Q5_K: return &q5k;
    case DType::Q6_K: return &q6k;
    default: return nullptr;
  }
}

// Round to bfloat16, nearest even (c10::BFloat16's rule; NaN -> 0x7fc0).
inline uint16_t bf16_bits(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline void put(float* dst, const float* y, int n) { std::memcpy(dst, y, static_cast<size_t>(n) * 4); }
inline void put(uint16_t* dst, const float* y, int n) {
  for (int i = 0; i < n; ++i) dst[i] = bf16_bits(y[i]);
}

// --- Finishers: y from a decoded block, into float or bf16 -----------------------------------

template <class Out>
void finish_scalar(const Decoded& d, const BlockForm& f, Out* y) {
  float v[256];
  for (int i = 0; i < f.elements; ++i) {
    const int g = i / f.group;
    v[i] = h(d.s[g] * static_cast<float>(d.q[i]));
    if (f.offset) v[i] = h(v[i] + d.c[g]);
  }
  put(y, v, f.elements);
}

#ifdef FLUXMPI_DEQUANTIZE_X86
// No FMA in the targets: the product is rounded to fp16 before the offset is added.
#define FLUXMPI_AVX2 __attribute__((target("avx2,f16c")))
#define FLUXMPI_AVX512 __attribute__((target("avx512f,f16c")))

FLUXMPI_AVX2 inline __m256 round16_avx2(__m256 x) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
FLUXMPI_AVX2 inline void store8(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
FLUXMPI_AVX2 inline void store8(uint16_t* y, __m256 v) {
  // Finite or infinite fp16 values: round to nearest even without a NaN case.
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y), _mm256_castsi256_si128(packed));
}

template <class Out>
FLUXMPI_AVX2 void finish_avx2(const Decoded& d, const BlockForm& f, Out* y) {
  for (int g = 0; g < f.elements / f.group; ++g) {
    const __m256 s = _mm256_set1_ps(d.s[g]), c = _mm256_set1_ps(f.offset ? d.c[g] : 0.0f);
    for (int i = g * f.group; i < (g + 1) * f.group; i += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(d.q + i));
      __m256 v = round16_avx2(_mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
      if (f.offset) v = round16_avx2(_mm256_add_ps(v, c));
      store8(y + i, v);
    }
  }
}

FLUXMPI_AVX512 inline __m512 round16_avx512(__m512 x) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
FLUXMPI_AVX512 inline void store16(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
FLUXMPI_AVX512 inline void store16(uint16_t* y, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), _mm512_cvtepi32_epi16(r));
}

template <class Out>
FLUXMPI_AVX512 void finish_avx512(const Decoded& d, const BlockForm& f, Out* y) {
  for (int g = 0; g < f.elements / f.group; ++g) {
    const __m512 s = _mm512_set1_ps(d.s[g]), c = _mm512_set1_ps(f.offset ? d.c[g] : 0.0f);
    for (int i = g * f.group; i < (g + 1) * f.group; i += 16) {
      const __m128i q8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d.q + i));
      __m512 v = round16_avx512(_mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8))));
      if (f.offset) v = round16_avx512(_mm512_add_ps(v, c));
      store16(y + i, v);
    }
  }
}
#endif

template <class Out>
using Finisher = void (*)(const Decoded&, const BlockForm&, Out*);

template <class Out>
Finisher<Out> finisher(DequantizeKernel k) {
#ifdef FLUXMPI_DEQUANTIZE_X86
  if (k == DequantizeKernel::Avx512) return finish_avx512<Out>;
  if (k == DequantizeKernel::Avx2) return finish_avx2<Out>;
#endif
  (void)k;
  return finish_scalar<Out>;
}

#ifdef FLUXMPI_DEQUANTIZE_X86
// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports has no "f16c"); the AVX features'
// checks below include the operating system's support of their registers.
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

DequantizeKernel best_kernel() {
#ifdef FLUXMPI_DEQUANTIZE_X86
  __builtin_cpu_init();
  if (!has_f16c()) return DequantizeKernel::Scalar;
  if (__builtin_cpu_supports("avx512f")) return DequantizeKernel::Avx512;
  if (__builtin_cpu_supports("avx2")) return DequantizeKernel::Avx2;
#endif
  return DequantizeKernel::Scalar;
}

std::atomic<DequantizeKernel>& current_kernel() {
  static std::atomic<DequantizeKernel> k{best_kernel()};
  return k;
}

template <class Out>
void rows_of(DType dtype, const uint8_t* src, int64_t rows, int64_t cols, Out* dst, int64_t ld) {
  const uint64_t stride = row_bytes(dtype, cols);
  if (const BlockForm* form = block_form(dtype)) {
    const BlockFn scalar = block_fn(dtype);
    const Finisher<Out> finish = finisher<Out>(current_kernel().load(std::memory_order_relaxed));
    const uint64_t bytes = block_bytes(dtype);
    Decoded d;
    float v[256];
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = src + static_cast<uint64_t>(r) * stride;
      Out* out = dst + r * ld;
      for (int64_t b = 0; b < cols / form->elements; ++b) {
        const uint8_t* block = row + static_cast<uint64_t>(b) * bytes;
        Out* y = out + b * form->elements;
        if (form->decode(block, d)) {
          finish(d, *form, y);
        } else {
          scalar(block, v);
          put(y, v, form->elements);
        }
      }
    }
    return;
  }
  std::vector<float> v(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = src + static_cast<uint64_t>(r) * stride;
    switch (dtype) {
      case DType::F32:
        std::memcpy(v.data(), row, static_cast<size_t>(cols) * 4);
        break;
      case DType::F16:
        for (int64_t i = 0; i < cols; ++i) v[static_cast<size_t>(i)] = f16_at(row + 2 * i);
        break;
      case DType::BF16:
        for (int64_t i = 0; i < cols; ++i)
          v[static_cast<size_t>(i)] = float_of(static_cast<uint32_t>(row[2 * i] | (row[2 * i + 1] << 8)) << 16);
        break;
      default:
        throw InternalError(str_cat("cannot dequantize dtype ", dtype_name(dtype)));
    }
    put(dst + r * ld, v.data(), static_cast<int>(cols));
  }
}

}  // namespace

float half_to_float(uint16_t v) { return half_value(v); }
uint16_t float_to_half(float f) { return half_bits(f); }
uint16_t float_to_bf16(float f) { return bf16_bits(f); }

uint64_t row_bytes(DType dtype, int64_t cols) {
  const uint64_t block = block_elements(dtype);
  FLUX_CHECK(cols >= 0 && static_cast<uint64_t>(cols) % block == 0, "a row of ", cols, " elements is not whole ",
             dtype_name(dtype), " blocks of ", block);
  return static_cast<uint64_t>(cols) / block * block_bytes(dtype);
}

void dequantize_rows(DType dtype, const uint8_t* src, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  rows_of(dtype, src, rows, cols, dst, ld);
}

void dequantize_rows_bf16(DType dtype, const uint8_t* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld) {
  rows_of(dtype, src, rows, cols, dst, ld);
}

bool dequantize_kernel_supported(DequantizeKernel k) {
  const DequantizeKernel best = best_kernel();
  return k == DequantizeKernel::Scalar || (k == DequantizeKernel::Avx2 && best != DequantizeKernel::Scalar) ||
         (k == DequantizeKernel::Avx512 && best == DequantizeKernel::Avx512);
}

DequantizeKernel dequantize_kernel() { return current_kernel().load(); }

void set_dequantize_kernel(DequantizeKernel k) {
  FLUX_CHECK(dequantize_kernel_supported(k), "dequantization kernel ", dequantize_kernel_name(k),
             " is not supported on this CPU or build");
  current_kernel().store(k);
}

const char* dequantize_kernel_name(DequantizeKernel k) {
  switch (k) {
    case DequantizeKernel::Scalar: return "scalar";
    case DequantizeKernel::Avx2: return "avx2+f16c";
    case DequantizeKernel::Avx512: return "avx512f";
  }
  return "?";
}

}  // namespace fluxmpi::io
