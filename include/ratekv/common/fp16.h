// ratekv/common/fp16.h — IEEE-754 binary16 and bfloat16 <-> float32, scalar reference.
//
// Conversions round to nearest-even (float -> half), handle subnormals, inf and
// NaN. These define how every fp16 norm/scale in a packed format is stored.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ratekv {

/// binary16 bits -> float32 (exact).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// float32 -> binary16 bits, round to nearest even; overflow -> inf, NaN kept.
inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520 -> inf
  if (absx < 0x38800000u) {                                    // subnormal or zero in half
    if (absx < 0x33000000u) return (uint16_t)sign;             // < 2^-25 -> 0
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (113 - e) ... places mantissa at 2^-24 units
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return (uint16_t)(sign | r);
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return (uint16_t)(sign | r);
}

/// Rounds a float32 through binary16 and back (what storing it as fp16 does).
inline float round_fp16(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }

/// out[i] = round_fp16(x[i]) for i < n (out may be x). Returns the index of the first finite value that
/// rounds to an infinity (|x| ≥ 65520: beyond fp16), or -1 when there is none, and that value in
/// *bad_value (out may have overwritten it); callers turn it into an error naming the row, instead of
/// storing inf silently.
inline int64_t round_fp16_span(const float* x, int64_t n, float* out, float* bad_value) {
  int64_t bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i], r = round_fp16(v);
    if (bad < 0 && !std::isfinite(r) && std::isfinite(v)) {
      bad = i;
      *bad_value = v;
    }
    out[i] = r;
  }
  return bad;
}

/// bfloat16 bits -> float32 (exact).
inline float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace ratekv
