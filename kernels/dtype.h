#pragma once

// Host-side conversions between float and the 16- and 8-bit cache types, bit for bit what the
// GPU does (round to nearest even). Used by the CPU references, the tests and the benchmark.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/types.h"

namespace kvpool::kernels {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float BF16ToFloat(uint16_t h) { return BitsFloat(uint32_t{h} << 16); }

inline uint16_t FloatToBF16(float f) {
  uint32_t u = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep it a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);                                      // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float FP16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {                                                        // zero / subnormal
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t FloatToFP16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;            // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {                    // subnormal half: multiples of 2^-24
    const float q = std::nearbyint(a * 16777216.0f);  // default rounding mode: nearest even
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t v = u & 0x7fffffffu;
  v += 0xfff + ((v >> 13) & 1);  // round 23 -> 10 mantissa bits, nearest even
  return sign | static_cast<uint16_t>(((v >> 13) - (112u << 10)) & 0x7fff);
}

// float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448; 0x7f/0xff are NaN.
inline float FP8E4M3ToFloat(uint8_t b) {
  const int sign = b >> 7;
  const int exp = (b >> 3) & 0xf;
  const int mant = b & 0x7;
  float v;
  if (exp == 0xf && mant == 0x7) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);
  } else {
    v = std::ldexp(1.0f + mant / 8.0f, exp - 7);
  }
  return sign ? -v : v;
}

// Round to nearest even, saturating to +-448 (as the GPU's satfinite conversion does).
inline uint8_t FloatToFP8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  // Smallest step is 2^-9 (subnormals); normal numbers with exponent e have step 2^(e-3).
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int unbiased = e - 1;
  if (unbiased < -6) unbiased = -6;  // subnormal range uses the step of exponent -6
  const float step = std::ldexp(1.0f, unbiased - 3);
  const float q = std::nearbyint(a / step) * step;
  if (q == 0.0f) return sign;
  int qe;
  std::frexp(q, &qe);
  const int qu = qe - 1;
  if (qu < -6) return sign | static_cast<uint8_t>(std::lround(q / std::ldexp(1.0f, -9)));
  const int mant = static_cast<int>(std::lround((q / std::ldexp(1.0f, qu) - 1.0f) * 8.0f));
  return sign | static_cast<uint8_t>(((qu + 7) << 3) | mant);
}

// Element i of a buffer of type t, as float.
inline float LoadAsFloat(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kBF16:
      return BF16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP16:
      return FP16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP8E4M3:
      return FP8E4M3ToFloat(static_cast<const uint8_t*>(base)[i]);
  }
  return NAN;
}

inline void StoreFromFloat(void* base, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBF16(v);
      return;
    case DType::kFP16:
      static_cast<uint16_t*>(base)[i] = FloatToFP16(v);
      return;
    case DType::kFP8E4M3:
      static_cast<uint8_t*>(base)[i] = FloatToFP8E4M3(v);
      return;
  }
}

}  // namespace kvpool::kernels
