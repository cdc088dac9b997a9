// ratekv/quant/rd_fit.h — rate–distortion curves D(b) = α·β^(−b)
// (RateQuant, DESIGN.md §4): fit by least squares in the log domain,
//   ln D = ln α − b ln β,
// over the measured (b, D) points (b = code bits per element).
#pragma once

#include <vector>

namespace ratekv::quant {

struct RDPoint {
  double bits = 0.0;        // code bits per element b
  double distortion = 0.0;  // D(b) > 0
};

struct RDFit {
  double alpha = 0.0;
  double beta = 0.0;
  double rmse_log = 0.0;    // RMS residual of ln D
  double bits_min = 0.0, bits_max = 0.0;
};

/// Least-squares fit of ln D = ln α − b ln β. Throws Error if fewer than two
/// distinct bit widths are given or a distortion is not positive and finite.
RDFit fit_rd(const std::vector<RDPoint>& points);

}  // namespace ratekv::quant
