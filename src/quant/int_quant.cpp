// Uniform integer group quantization with fp16 scale / zero.
#include "ratekv/quant/int_quant.h"

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::quant {

IntGroupParams quantize_asym(const float* x, int64_t n, int64_t stride, int bits, uint8_t* codes) {
  check(bits >= 1 && bits <= 8, "integer quantizer: bits {} is out of range (expected 1..8)", bits);
  check(n >= 1, "integer quantizer: empty group");
  float mn = x[0], mx = x[0];
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i * stride];
    check(std::isfinite(v), "integer quantizer: non-finite value at group element {}", i);
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  const int qmax = (1 << bits) - 1;
  IntGroupParams p;
  p.zero = fp32_to_fp16(mn);
  const float z = fp16_to_fp32(p.zero);
  p.scale = fp32_to_fp16((mx - z) / (float)qmax);
  const float s = fp16_to_fp32(p.scale);
  check(std::isfinite(z) && std::isfinite(s), "integer quantizer: group range [{}, {}] overflows fp16", mn, mx);
  const float inv = s > 0 ? 1.0f / s : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float q = std::nearbyint((x[i * stride] - z) * inv);
    codes[i] = (uint8_t)std::clamp(q, 0.0f, (float)qmax);
  }
  return p;
}

void dequantize_asym(const uint8_t* codes, int64_t n, IntGroupParams p, float* x, int64_t stride) {
  const float z = fp16_to_fp32(p.zero), s = fp16_to_fp32(p.scale);
  for (int64_t i = 0; i < n; ++i) x[i * stride] = z + s * (float)codes[i];
}

IntGroupParams quantize_sym(const float* x, int64_t n, int64_t stride, int bits, uint8_t* codes) {
  check(bits >= 2 && bits <= 8, "symmetric integer quantizer: bits {} is out of range (expected 2..8)", bits);
  check(n >= 1, "integer quantizer: empty group");
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i * stride];
    check(std::isfinite(v), "integer quantizer: non-finite value at group element {}", i);
    amax = std::max(amax, std::fabs(v));
  }
  const int L = (1 << (bits - 1)) - 1;
  IntGroupParams p;
  p.scale = fp32_to_fp16(amax / (float)L);
  const float s = fp16_to_fp32(p.scale);
  check(std::isfinite(s), "integer quantizer: group max |x| = {} overflows fp16", amax);
  const float inv = s > 0 ? 1.0f / s : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float q = std::clamp(std::nearbyint(x[i * stride] * inv), (float)-L, (float)L);
    codes[i] = (uint8_t)(q + (float)L);
  }
  return p;
}

void dequantize_sym(const uint8_t* codes, int64_t n, int bits, IntGroupParams p, float* x, int64_t stride) {
  const int L = (1 << (bits - 1)) - 1;
  const float s = fp16_to_fp32(p.scale);
  for (int64_t i = 0; i < n; ++i) x[i * stride] = s * (float)((int)codes[i] - L);
}

}  // namespace ratekv::quant
