// Log-domain least-squares fit of D(b) = α β^(−b).
#include "ratekv/quant/rd_fit.h"

#include <algorithm>
#include <cmath>

#include "ratekv/error.h"

namespace ratekv::quant {

RDFit fit_rd(const std::vector<RDPoint>& points) {
  check(points.size() >= 2, "fit_rd: need at least two (bits, distortion) points, got {}", points.size());
  double sb = 0, sy = 0;
  for (const auto& p : points) {
    check(std::isfinite(p.distortion) && p.distortion > 0,
          "fit_rd: distortion at {} bits must be positive and finite, got {}", p.bits, p.distortion);
    sb += p.bits;
    sy += std::log(p.distortion);
  }
  const double n = (double)points.size(), mb = sb / n, my = sy / n;
  double sbb = 0, sby = 0;
  for (const auto& p : points) {
    sbb += (p.bits - mb) * (p.bits - mb);
    sby += (p.bits - mb) * (std::log(p.distortion) - my);
  }
  check(sbb > 0, "fit_rd: all points have the same bit width {}", points[0].bits);
  const double slope = sby / sbb;  // = −ln β
  RDFit f;
  f.beta = std::exp(-slope);
  f.alpha = std::exp(my - slope * mb);
  double ss = 0;
  for (const auto& p : points) {
    const double r = std::log(p.distortion) - (my + slope * (p.bits - mb));
    ss += r * r;
  }
  f.rmse_log = std::sqrt(ss / n);
  f.bits_min = std::min_element(points.begin(), points.end(), [](auto& a, auto& b) { return a.bits < b.bits; })->bits;
  f.bits_max = std::max_element(points.begin(), points.end(), [](auto& a, auto& b) { return a.bits < b.bits; })->bits;
  return f;
}

}  // namespace ratekv::quant
