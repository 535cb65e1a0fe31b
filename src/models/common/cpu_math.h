#pragma once
/// Float helpers of the hand-written CPU loops (flux/fused.cpp, tiled_attention.cpp): bf16 <-> float
/// on the bits, a fixed-order sum and an exponential written so that the loops that call them
/// vectorise. No libm calls, no reassociation: every caller computes the same values whatever
/// vector width the compiler picks.

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace fluxmpi::nn::cpu {

// bf16 <-> float as c10::BFloat16 does it (round to nearest even, NaN kept quiet), written on the
// bits so that the compiler can vectorise the loops.
inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) { return f; }
/// c10::BFloat16(f)'s rounding (to nearest, ties to even; NaN to the quiet 0x7FC0) without its
/// branch, so that a loop of it vectorises (c10's constructor keeps a loop scalar).
template <>
inline c10::BFloat16 from_float<c10::BFloat16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
  return c10::BFloat16(static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded),
                       c10::BFloat16::from_bits());
}
/// The value a tensor of T holds after storing f (identity for float).
template <typename T>
inline float round_to(float f) { return to_float(from_float<T>(f)); }

/// term(0) + ... + term(n - 1) in 8 interleaved partial sums, combined pairwise: one fixed order,
/// and a loop the compiler vectorises.
template <typename Term>
inline float sum8(int64_t n, Term term) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += term(i + j);
  for (; i < n; ++i) part[0] += term(i);
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

/// The bits of a float and back (defined behaviour, and vectorised by the compiler).
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// e^x for x <= 0 in plain float arithmetic (no libm call, so that a loop of it vectorises):
/// x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series to r^7 (truncation < 6e-9
/// relative), times 2^n written into the exponent bits. Below -87 (e^-87 ~ 1.6e-38, near the
/// smallest normal float), -inf included, the result is 0, as libtorch's softmax gives there.
inline float exp_nonpositive(float x_in) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float x = x_in < -87.0f ? -87.0f : x_in;
  const float shifted = x * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const int32_t ni = static_cast<int32_t>(float_bits(shifted) - float_bits(kRound));  // n as an integer
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;  // ln2 in two parts
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float e = p * bits_float(static_cast<uint32_t>(ni + 127) << 23);
  return x_in < -87.0f ? 0.0f : e;
}

/// 2^x for x <= 0, the base-2 twin of exp_nonpositive with fewer operations: x = n + r with
/// |r| <= 1/2 (exact: no ln2 to split), 2^r by a degree-6 polynomial fitted to it on [-1/2, 1/2]
/// for the least largest relative error (2.0e-9 in exact arithmetic; 8.5e-8 evaluated in float
/// with FMA, as close as exp_nonpositive's Taylor series comes), times 2^n written into the
/// exponent bits. Below -126 (2^-126, the smallest normal float), -inf included, the result is 0.
inline float exp2_nonpositive(float x_in) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float x = x_in < -126.0f ? -126.0f : x_in;
  const float shifted = x + kRound;
  const float n = shifted - kRound;
  const int32_t ni = static_cast<int32_t>(float_bits(shifted) - float_bits(kRound));  // n as an integer
  const float r = x - n;
  float p = 1.535335468e-04f;
  p = p * r + 1.339887385e-03f;
  p = p * r + 9.618436918e-03f;
  p = p * r + 5.550332367e-02f;
  p = p * r + 2.402264774e-01f;
  p = p * r + 6.931471825e-01f;
  p = p * r + 1.0f;
  const float e = p * bits_float(static_cast<uint32_t>(ni + 127) << 23);
  return x_in < -126.0f ? 0.0f : e;
}

}  // namespace fluxmpi::nn::cpu

/// The loops of the CPU kernels, compiled also for AVX2 and AVX-512 and picked by the CPU at load
/// time (GCC's target_clones): 8 and 16 floats a vector where the baseline x86-64 build has 4.
/// The AVX2 and AVX-512 clones may contract a * b + c into one FMA (GCC contracts in C++ by
/// default), the baseline one cannot: a CPU always runs the same clone, so results are the same
/// from run to run and rank to rank on one machine, and may differ in the last bit between CPUs
/// with and without FMA.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FLUXMPI_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FLUXMPI_VECTOR_CLONES
#endif
