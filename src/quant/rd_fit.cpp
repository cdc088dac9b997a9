// Log-domain least-squares fit of D(b) = α β^(−b).
#include "ratekv/quant/rd_fit.h"

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"

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

SharedBetaFit fit_rd_shared_beta(const std::vector<double>& bits, const std::vector<double>& distortion, size_t n) {
  const size_t nb = bits.size();
  check(n >= 1, "fit_rd_shared_beta: need at least one component");
  check(distortion.size() == n * nb, "fit_rd_shared_beta: {} distortions for {} components × {} widths", distortion.size(),
        n, nb);
  check(nb >= 2, "fit_rd_shared_beta: need at least two bit widths, got {}", nb);
  double mb = 0;
  for (double b : bits) {
    check(std::isfinite(b), "fit_rd_shared_beta: non-finite bit width");
    mb += b;
  }
  mb /= (double)nb;
  double sbb = 0;
  for (double b : bits) sbb += (b - mb) * (b - mb);
  check(sbb > 0, "fit_rd_shared_beta: all bit widths equal {}", bits[0]);
  std::vector<double> y(distortion.size()), ybar(n, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < nb; ++j) {
      const double d = distortion[i * nb + j];
      check(std::isfinite(d) && d > 0, "fit_rd_shared_beta: distortion of component {} at {} bits must be positive and finite, got {}",
            i, bits[j], d);
      y[i * nb + j] = std::log(d);
      ybar[i] += y[i * nb + j] / (double)nb;
    }
  double sby = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < nb; ++j) sby += (bits[j] - mb) * (y[i * nb + j] - ybar[i]);
  const double slope = sby / ((double)n * sbb);  // = −ln β
  SharedBetaFit f;
  f.beta = std::exp(-slope);
  f.alpha.resize(n);
  double gmean = 0;
  for (size_t i = 0; i < n; ++i) {
    f.alpha[i] = std::exp(ybar[i] - slope * mb);
    gmean += ybar[i] / (double)n;
  }
  double ss_res = 0, ss_tot = 0, ss_within = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < nb; ++j) {
      const double yij = y[i * nb + j];
      const double r = yij - (ybar[i] + slope * (bits[j] - mb));
      ss_res += r * r;
      ss_tot += (yij - gmean) * (yij - gmean);
      ss_within += (yij - ybar[i]) * (yij - ybar[i]);
      f.max_abs_log_err = std::max(f.max_abs_log_err, std::abs(r));
    }
  f.rms_log_err = std::sqrt(ss_res / (double)(n * nb));
  f.r2_log = ss_tot > 0 ? 1.0 - ss_res / ss_tot : 1.0;
  f.r2_within = ss_within > 0 ? 1.0 - ss_res / ss_within : 1.0;
  return f;
}

}  // namespace ratekv::quant
