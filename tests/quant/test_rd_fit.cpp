// D(b) = α β^(−b) fits: exact recovery on synthetic curves, and β of TQ-MSE
// at m = 128 over b = 1..5 near 3.5 (docs/design.md §2.2) from the exact density.
#include <gtest/gtest.h>

#include <cmath>

#include "ratekv/common/error.h"
#include "ratekv/quant/lloyd_max.h"
#include "ratekv/quant/rd_fit.h"

using namespace ratekv;
using namespace ratekv::quant;

TEST(RDFit, RecoversExactCurve) {
  std::vector<RDPoint> pts;
  for (int b = 1; b <= 5; ++b) pts.push_back({(double)b, 0.7 * std::pow(3.3, -b)});
  const RDFit f = fit_rd(pts);
  EXPECT_NEAR(f.alpha, 0.7, 1e-12);
  EXPECT_NEAR(f.beta, 3.3, 1e-12);
  EXPECT_NEAR(f.rmse_log, 0.0, 1e-12);
  EXPECT_EQ(f.bits_min, 1.0);
  EXPECT_EQ(f.bits_max, 5.0);
}

TEST(RDFit, TQMSEBetaNear3p5) {
  std::vector<RDPoint> pts;
  for (int b = 1; b <= 5; ++b) pts.push_back({(double)b, lloyd_max_codebook(128, b).distortion});
  const RDFit f = fit_rd(pts);
  EXPECT_NEAR(f.beta, 3.5, 0.15);
  // m = 3: D = 4^(−b) exactly → β = 4, α = 1.
  pts.clear();
  for (int b = 1; b <= 5; ++b) pts.push_back({(double)b, lloyd_max_codebook(3, b).distortion});
  EXPECT_NEAR(fit_rd(pts).beta, 4.0, 1e-9);
  EXPECT_NEAR(fit_rd(pts).alpha, 1.0, 1e-9);
}

TEST(RDFit, RejectsBadPoints) {
  EXPECT_THROW(fit_rd({{1, 0.5}}), Error);
  EXPECT_THROW(fit_rd({{1, 0.5}, {1, 0.4}}), Error);
  EXPECT_THROW(fit_rd({{1, 0.5}, {2, 0.0}}), Error);
  EXPECT_THROW(fit_rd({{1, 0.5}, {2, NAN}}), Error);
}
