// ratekv/quant/rd_fit.h — rate–distortion curves D(b) = α·β^(−b)
// (RateQuant, docs/design.md §4.2): fit by least squares in the log domain,
//   ln D = ln α − b ln β,
// over the measured (b, D) points (b = code bits per element).
#pragma once

#include <cstddef>
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

namespace ratekv::quant {

/// Fit of D_i(b) = α_i β^(−b) over n components sharing one β (RateQuant's
/// per-(quantizer, side) curve, docs/design.md §4.2).
struct SharedBetaFit {
  double beta = 0.0;             ///< common base β = exp(−slope)
  std::vector<double> alpha;     ///< (n,) per-component α_i
  double r2_log = 0.0;           ///< 1 − SS_res / SS_tot of ln D over all n·nb points (SS_tot about the global mean)
  double r2_within = 0.0;        ///< same with SS_tot about each component's mean (the part the bit slope explains)
  double rms_log_err = 0.0;      ///< RMS residual of ln D
  double max_abs_log_err = 0.0;  ///< max |residual| of ln D
};

/// Least squares in the log domain with a common slope:
///   minimize Σ_i Σ_j (ln D_ij − ln α_i + b_j ln β)²,
/// whose solution is the pooled within-component slope
///   −ln β = Σ_ij (b_j − b̄)(y_ij − ȳ_i) / (n Σ_j (b_j − b̄)²),  ln α_i = ȳ_i + b̄ ln β
/// (every component measured at the same widths b_j). `distortion` is (n, nb)
/// row-major. Exact (to rounding) on data generated from the model. Throws
/// Error if n < 1, the sizes disagree, fewer than two distinct widths are
/// given, or a distortion is not positive and finite (naming its index).
SharedBetaFit fit_rd_shared_beta(const std::vector<double>& bits, const std::vector<double>& distortion, size_t n);

}  // namespace ratekv::quant
