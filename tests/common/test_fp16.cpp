#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ratekv/common/fp16.h"

using namespace ratekv;

// Known bit patterns of IEEE binary16.
TEST(Fp16, KnownValues) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(fp32_to_fp16(5.9604645e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0.333251953125f), 0x3555);
  EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_fp32(0x0001), 5.9604645e-08f);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(fp16_to_fp32(0x7c00), std::numeric_limits<float>::infinity());
}

// Round-trip every binary16 value exactly; rounding is to nearest even.
TEST(Fp16, AllHalfValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32((uint16_t)h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(fp32_to_fp16(f), (uint16_t)h) << h;
  }
  // Halfway between 1.0 (0x3c00) and next (0x3c01): ties to even -> 0x3c00.
  EXPECT_EQ(fp32_to_fp16(1.0f + 1.0f / 2048.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 3.0f / 2048.0f), 0x3c02);
}

TEST(Bf16, Exact) {
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xc040), -3.0f);
}
