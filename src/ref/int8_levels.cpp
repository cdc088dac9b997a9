// ref::int8_levels (include/ratekv/ref/int8_levels.h).
#include "ratekv/ref/int8_levels.h"

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"

namespace ratekv::ref {

std::vector<float> int8_levels(std::span<const float> levels, float* scale) {
  check(levels.size() >= 2 && levels.size() <= 16,
        "int8_levels: {} levels, expected 2..16 (a 1..4-bit codebook)", levels.size());
  float amax = 0.f;
  for (float v : levels) {
    check(std::isfinite(v), "int8_levels: level {} is not finite", v);
    amax = std::max(amax, std::fabs(v));
  }
  // The smallest scale that fits ±127, then up to 12.5 % coarser in 64 steps:
  // the scale with the least Σ (L − s·round(L/s))² (ties: the smallest).
  const double s0 = amax > 0.f ? amax / 127.0 : 1.0;
  double best_s = s0, best_e = INFINITY;
  for (int j = 0; j <= 64; ++j) {
    const double sc = s0 * (1.0 + j / 512.0);
    double e = 0;
    for (float v : levels) {
      const double r = v - sc * std::nearbyint(v / sc);
      e += r * r;
    }
    if (e < best_e) best_e = e, best_s = sc;
  }
  const float sf = (float)best_s;
  std::vector<float> out(levels.size());
  for (size_t i = 0; i < levels.size(); ++i) {
    const long k = std::lrint(levels[i] / sf);
    out[i] = sf * (float)std::clamp(k, -127L, 127L);
  }
  if (scale) *scale = sf;
  return out;
}

}  // namespace ratekv::ref
