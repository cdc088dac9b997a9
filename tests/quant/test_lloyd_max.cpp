// Lloyd–Max codebooks for f_m against closed forms and independent quadrature.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "ratekv/common/error.h"
#include "ratekv/quant/lloyd_max.h"

using namespace ratekv;
using namespace ratekv::quant;

// m = 3: f_3 is uniform on [−1, 1]; the Lloyd–Max quantizer is the uniform
// one, D = 3 · (2/2^b)²/12 = 4^(−b) exactly, levels at odd multiples of 2^(−b).
TEST(LloydMax, M3IsUniformQuantizer) {
  for (int b = 1; b <= 8; ++b) {
    const Codebook& cb = lloyd_max_codebook(3, b);
    EXPECT_NEAR(cb.distortion, std::pow(4.0, -b), 1e-12 * std::pow(4.0, -b) + 1e-15) << "b=" << b;
    const int K = 1 << b;
    for (int j = 0; j < K; ++j) EXPECT_NEAR(cb.levels_f64[j], -1.0 + (2.0 * j + 1) / K, 1e-10) << b << " " << j;
  }
}

// m = 2, b = 1: levels ±E|t| = ±2/π under the arcsine density, D = 1 − 8/π².
TEST(LloydMax, M2OneBitClosedForm) {
  const Codebook& cb = lloyd_max_codebook(2, 1);
  EXPECT_NEAR(cb.levels_f64[1], 2.0 / std::numbers::pi, 1e-12);
  EXPECT_NEAR(cb.distortion, 1.0 - 8.0 / (std::numbers::pi * std::numbers::pi), 1e-12);
}

// m = 128, b = 1..4: 0.361, 0.116, 0.034, 0.0093 (docs/design.md §2.2), within 2 %.
TEST(LloydMax, M128PublishedDistortions) {
  const double expect[4] = {0.361, 0.116, 0.034, 0.0093};
  for (int b = 1; b <= 4; ++b)
    EXPECT_NEAR(lloyd_max_codebook(128, b).distortion, expect[b - 1], 0.02 * expect[b - 1]) << "b=" << b;
  // 1 bit: levels ±E|t| = ±C·2/(m−1) exactly.
  const double C = std::exp(std::lgamma(64.0) - std::lgamma(63.5)) / std::sqrt(std::numbers::pi);
  EXPECT_NEAR(lloyd_max_codebook(128, 1).levels_f64[1], 2.0 * C / 127.0, 1e-12);
}

// The CDF recurrence against a brute-force midpoint rule on the density in
// θ-space (an independent computation), for odd/even m and m = 2's singular ends.
TEST(LloydMax, CdfMatchesQuadrature) {
  for (int m : {2, 3, 4, 7, 64, 129}) {
    for (double t : {-0.999, -0.5, -0.05, 0.0, 0.13, 0.7, 0.9999}) {
      const int N = 200000;
      const double lo = -std::numbers::pi / 2, hi = std::asin(t);
      double s = 0.0;
      for (int i = 0; i < N; ++i) {
        const double th = lo + (hi - lo) * (i + 0.5) / N;
        s += sphere_coord_density(m, std::sin(th)) * std::cos(th);
      }
      s *= (hi - lo) / N;
      EXPECT_NEAR(sphere_coord_cdf(m, t), s, 1e-8) << "m=" << m << " t=" << t;
    }
  }
}

// Lloyd–Max optimality: thresholds are midpoints, levels are centroids, and
// moving any level increases the analytic distortion.
TEST(LloydMax, OptimalityConditions) {
  for (int m : {2, 5, 64, 128}) {
    for (int b : {1, 2, 3, 5, 8}) {
      const Codebook& cb = lloyd_max_codebook(m, b);
      const int K = 1 << b;
      ASSERT_EQ((int)cb.levels.size(), K);
      ASSERT_EQ((int)cb.thresholds.size(), K - 1);
      for (int j = 0; j + 1 < K; ++j) {
        EXPECT_LT(cb.levels_f64[j], cb.levels_f64[j + 1]);
        EXPECT_FLOAT_EQ(cb.thresholds[j], (float)(0.5 * (cb.levels_f64[j] + cb.levels_f64[j + 1])));
      }
      for (int j = 0; j < K; ++j) EXPECT_NEAR(cb.levels_f64[j], -cb.levels_f64[K - 1 - j], 1e-15);
      // Centroid condition, with the cell's first moment by an independent
      // composite Simpson rule in θ-space (t = sin θ) and its mass from the CDF.
      for (int j = 0; j < K; ++j) {
        const double a = j == 0 ? -1.0 : 0.5 * (cb.levels_f64[j - 1] + cb.levels_f64[j]);
        const double bnd = j + 1 == K ? 1.0 : 0.5 * (cb.levels_f64[j] + cb.levels_f64[j + 1]);
        const double lo = std::asin(a), hi = std::asin(bnd);
        const int N = 4000;  // even
        // f_m(sin θ) cos θ = C cos^(m−2) θ, finite at θ = ±π/2 even for m = 2.
        const double C = std::exp(std::lgamma(m / 2.0) - std::lgamma((m - 1) / 2.0)) / std::sqrt(std::numbers::pi);
        auto g = [&](double th) { return std::sin(th) * C * std::pow(std::cos(th), m - 2); };
        double mom = g(lo) + g(hi);
        for (int i = 1; i < N; ++i) mom += (i % 2 ? 4.0 : 2.0) * g(lo + (hi - lo) * i / N);
        mom *= (hi - lo) / N / 3.0;
        const double mass = sphere_coord_cdf(m, bnd) - sphere_coord_cdf(m, a);
        EXPECT_NEAR(cb.levels_f64[j], mom / mass, 1e-6 * (bnd - a)) << "m=" << m << " b=" << b << " j=" << j;
      }
      // Moving the middle level increases the analytic distortion.
      const double sigma = 1.0 / std::sqrt((double)m);
      for (double eps : {-1e-2, 1e-2}) {
        auto lv = cb.levels_f64;
        lv[K / 2] += eps * sigma / K;
        EXPECT_GT(codebook_distortion(m, lv), cb.distortion) << "m=" << m << " b=" << b;
      }
      // Distortion decreases with b.
      if (b > 1) {
        EXPECT_LT(cb.distortion, lloyd_max_codebook(m, b - 1).distortion);
      }
    }
  }
}

TEST(LloydMax, RejectsBadArguments) {
  EXPECT_THROW(lloyd_max_codebook(1, 2), Error);
  EXPECT_THROW(lloyd_max_codebook(64, 0), Error);
  EXPECT_THROW(lloyd_max_codebook(64, 9), Error);
}
