// TurboQuant-prod: unbiased inner products (the point of the QJL stage), bits,
// and its MSE against TQ-MSE at equal code bits.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ratekv/quant/prng.h"
#include "ratekv/quant/tq_mse.h"
#include "ratekv/quant/tq_prod.h"

using namespace ratekv;
using namespace ratekv::quant;

TEST(TQProd, InnerProductUnbiasedAcrossSeeds) {
  const int m = 64, seeds = 400;
  SplitMix64 rng(2);
  std::vector<float> x(m), q(m), xh(m);
  for (auto& v : x) v = (float)rng.gaussian();
  for (auto& v : q) v = (float)rng.gaussian();
  double exact = 0;
  for (int i = 0; i < m; ++i) exact += (double)q[i] * x[i];
  for (int b : {1, 2, 3}) {
    double mean_prod = 0, mean_mse = 0;
    for (int s = 0; s < seeds; ++s) {
      TQProd p({.dim = m, .bits = b, .seed = (uint64_t)s});
      p.fake_quant(x.data(), 1, xh.data());
      double ip = 0;
      for (int i = 0; i < m; ++i) ip += (double)q[i] * xh[i];
      mean_prod += ip / seeds;
      TQMSE t({.dim = m, .bits = b, .seed = (uint64_t)s});
      t.fake_quant(x.data(), 1, xh.data());
      ip = 0;
      for (int i = 0; i < m; ++i) ip += (double)q[i] * xh[i];
      mean_mse += ip / seeds;
    }
    const double qn = std::sqrt(m), xn = std::sqrt(m);  // ~‖q‖, ‖x‖
    // TQ-prod is unbiased (standard error ≈ ‖q‖‖x‖·sqrt(π/2/m)/sqrt(seeds));
    // TQ-MSE shrinks inner products by (1 − D)-ish at low bits.
    EXPECT_NEAR(mean_prod, exact, 4.0 * qn * xn * std::sqrt(1.571 / m) / std::sqrt((double)seeds)) << "b=" << b;
    if (b == 1) {
      EXPECT_LT(std::fabs(mean_mse), std::fabs(exact) * 0.8);
    }
  }
  EXPECT_DOUBLE_EQ(TQProd({.dim = 64, .bits = 3}).bits_per_element(), 3.5);
}
