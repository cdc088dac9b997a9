// ref::int8_levels (the integer CUDA kernels' int8 key and value codebooks):
// levels already on an int8 grid come back exactly; every level within s/2
// of its int8 image; the chosen scale is never worse than the smallest
// admissible one (max|L|/127); the real Lloyd–Max codebooks at 1..4 bits lose
// < 0.5 % of their largest level; bad codebooks throw.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"
#include "ratekv/quant/lloyd_max.h"
#include "ratekv/ref/int8_levels.h"

using namespace ratekv;

TEST(RefInt8Levels, GridLevelsExactAndLloydMaxWithinHalfAStep) {
  float sc = 0.f;
  const std::vector<float> grid = {-127 * 0.01f, -40 * 0.01f, 3 * 0.01f, 90 * 0.01f};
  const std::vector<float> g8 = ref::int8_levels(grid, &sc);
  EXPECT_FLOAT_EQ(sc, 0.01f);
  for (size_t i = 0; i < grid.size(); ++i) EXPECT_FLOAT_EQ(g8[i], grid[i]);
  for (int m : {64, 128, 256})
    for (int bits = 1; bits <= 4; ++bits) {
      const std::vector<float>& L = quant::lloyd_max_codebook(m, bits).levels;
      const std::vector<float> L8 = ref::int8_levels(L, &sc);
      float amax = 0.f;
      for (float v : L) amax = std::max(amax, std::fabs(v));
      EXPECT_GE(sc, amax / 127.f * (1.f - 1e-6f));
      EXPECT_LE(sc, 1.125f * amax / 127.f * (1.f + 1e-6f));
      double e = 0, e0 = 0;
      const double s0 = amax / 127.0;
      for (size_t i = 0; i < L.size(); ++i) {
        const double k = L8[i] / sc;
        EXPECT_NEAR(k, std::nearbyint(k), 1e-3) << "not an int8 multiple of the scale";
        EXPECT_LE(std::fabs(k), 127.0 + 1e-3);
        EXPECT_LE(std::fabs(L8[i] - L[i]), 0.5f * sc * (1.f + 1e-5f));
        EXPECT_LE(std::fabs(L8[i] - L[i]), 0.005f * amax) << "m=" << m << " bits=" << bits;
        e += (L8[i] - L[i]) * (L8[i] - L[i]);
        e0 += std::pow(L[i] - s0 * std::nearbyint(L[i] / s0), 2);
      }
      EXPECT_LE(e, e0 * (1 + 1e-6) + 1e-18) << "m=" << m << " bits=" << bits;
    }
}

TEST(RefInt8Levels, BadCodebooksAreErrors) {
  EXPECT_THROW(ref::int8_levels(std::vector<float>{0.5f}), ratekv::Error);
  EXPECT_THROW(ref::int8_levels(std::vector<float>(17, 0.f)), ratekv::Error);
  EXPECT_THROW(ref::int8_levels(std::vector<float>{-1.f, NAN}), ratekv::Error);
}
