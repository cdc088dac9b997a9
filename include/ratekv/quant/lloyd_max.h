// ratekv/quant/lloyd_max.h — Lloyd–Max scalar codebooks for one coordinate of
// a uniformly random unit vector in R^m (TurboQuant, docs/design.md §2.2).
//
// Density on [-1,1]:  f_m(t) = Γ(m/2) / (√π Γ((m−1)/2)) · (1−t²)^((m−3)/2).
// With t = sin θ the mass becomes C·cos^(m−2)θ dθ, so the CDF is
//   F_m(t) = 1/2 + sgn(t)·C·I_{m−2}(asin|t|),  I_n(φ) = ∫_0^φ cos^n θ dθ,
// evaluated exactly by the recurrence I_n = cos^(n−1)φ sinφ / n + (n−1)/n·I_{n−2}
// (I_0 = φ, I_1 = sin φ): no quadrature error and no trouble with the
// integrable endpoint singularities of m = 2. First moments are closed form:
//   ∫_a^b t f_m(t) dt = C/(m−1)·[(1−a²)^((m−1)/2) − (1−b²)^((m−1)/2)].
// Lloyd–Max conditions (thresholds = midpoints, levels = cell centroids) are
// solved in double: Panter–Dite start (quantiles of f_m^(1/3)), 20 Lloyd
// steps, then damped Newton with the tridiagonal Jacobian until
// max|c − centroid(c)| < 1e-13·σ (σ = 1/√m) or the floating-point floor.
#pragma once

#include <vector>

namespace ratekv::quant {

/// A symmetric scalar codebook of 2^bits levels for f_m.
struct Codebook {
  int m = 0;                       // vector dimension the density belongs to
  int bits = 0;                    // 1..8
  std::vector<float> levels;       // (2^bits) ascending reconstruction points c_j
  std::vector<float> thresholds;   // (2^bits − 1) ascending decision bounds, midpoints of levels
  std::vector<double> levels_f64;  // the same levels in double (analysis)
  /// Unit-vector distortion E‖u − û‖² = m·E(t − q(t))² under f_m (analytic).
  double distortion = 0.0;
  int iterations = 0;              // Lloyd + Newton iterations used
};

/// f_m(t); 0 outside (−1,1). Throws Error if m < 2.
double sphere_coord_density(int m, double t);
/// F_m(t) = P(T ≤ t). Throws Error if m < 2.
double sphere_coord_cdf(int m, double t);

/// Analytic unit-vector distortion m·E(t − q(t))² of an arbitrary ascending set
/// of levels under f_m with nearest-level (midpoint) decisions.
double codebook_distortion(int m, const std::vector<double>& levels);

/// The Lloyd–Max codebook of f_m at `bits` bits, computed once per (m, bits)
/// and cached for the life of the process (thread-safe). The reference stays
/// valid forever. Throws Error if m < 2 or bits ∉ [1, 8].
const Codebook& lloyd_max_codebook(int m, int bits);

}  // namespace ratekv::quant
