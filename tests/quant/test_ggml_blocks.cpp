// llama.cpp q8_0 / q4_0: bit-exact against bytes written by ggml's own
// reference quantizers (tests/fixtures/quant/ggml_q8_0_q4_0.bin, produced by
// tools/ref/ggml_quant_fixture.cpp), plus a hand-derived block.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/quant/ggml_blocks.h"

using namespace ratekv;
using namespace ratekv::quant;

TEST(GgmlBlocks, MatchesGgmlReferenceFixture) {
  const std::string path = std::string(RATEKV_SOURCE_DIR) + "/tests/fixtures/quant/ggml_q8_0_q4_0.bin";
  std::ifstream f(path, std::ios::binary);
  ASSERT_TRUE(f) << path;
  std::vector<char> buf((std::istreambuf_iterator<char>(f)), {});
  ASSERT_GE(buf.size(), 16u);
  ASSERT_EQ(std::memcmp(buf.data(), "RKVQ", 4), 0);
  uint32_t hdr[3];
  std::memcpy(hdr, buf.data() + 4, 12);
  ASSERT_EQ(hdr[0], 1u);
  const uint32_t rows = hdr[1], k = hdr[2];
  const size_t nb = k / 32, row_bytes = k * 4 + nb * 34 + nb * 18;
  ASSERT_EQ(buf.size(), 16 + rows * row_bytes);
  ASSERT_GE(rows, 10u);
  for (uint32_t r = 0; r < rows; ++r) {
    const char* p = buf.data() + 16 + r * row_bytes;
    std::vector<float> x(k);
    std::memcpy(x.data(), p, k * 4);
    std::vector<BlockQ8_0> q8(nb);
    std::vector<BlockQ4_0> q4(nb);
    quantize_row_q8_0_ref(x.data(), q8.data(), k);
    quantize_row_q4_0_ref(x.data(), q4.data(), k);
    EXPECT_EQ(std::memcmp(q8.data(), p + k * 4, nb * 34), 0) << "q8_0 row " << r;
    EXPECT_EQ(std::memcmp(q4.data(), p + k * 4 + nb * 34, nb * 18), 0) << "q4_0 row " << r;
  }
}

// One hand-derived block each. q8_0: amax = 127 → d = 1: codes are roundf(x),
// halves away from zero. q4_0: max = −8 (largest |x|, sign kept) → d = 1,
// id = 1, q = min(15, trunc(x + 8.5)).
TEST(GgmlBlocks, HandDerivedBlock) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = 0.0f;
  x[0] = 127.0f;
  x[1] = 2.5f;    // → 3
  x[2] = -2.5f;   // → −3
  x[3] = 0.49f;   // → 0
  BlockQ8_0 b8;
  quantize_row_q8_0_ref(x, &b8, 32);
  EXPECT_EQ(b8.d, 0x3c00);  // fp16(1)
  EXPECT_EQ(b8.qs[0], 127);
  EXPECT_EQ(b8.qs[1], 3);
  EXPECT_EQ(b8.qs[2], -3);
  EXPECT_EQ(b8.qs[3], 0);
  float y[32];
  dequantize_row_q8_0(&b8, y, 32);
  EXPECT_EQ(y[1], 3.0f);

  for (int j = 0; j < 32; ++j) x[j] = 0.0f;
  x[0] = -8.0f;  // max = −8, d = 1
  x[1] = 7.9f;   // trunc(16.4) = 16 → 15
  x[16] = -7.6f; // trunc(0.9) = 0
  x[17] = 0.49f; // trunc(8.99) = 8
  x[2] = -0.5f;  // trunc(8.0) = 8
  BlockQ4_0 b4;
  quantize_row_q4_0_ref(x, &b4, 32);
  EXPECT_EQ(b4.d, 0x3c00);
  EXPECT_EQ(b4.qs[0], 0 | (0 << 4));   // x0 = −8 → 0; x16 = −7.6 → 0
  EXPECT_EQ(b4.qs[1], 15 | (8 << 4));  // x1 → 15; x17 → 8
  EXPECT_EQ(b4.qs[2], 8 | (8 << 4));
  dequantize_row_q4_0(&b4, y, 32);
  EXPECT_EQ(y[1], 7.0f);
  EXPECT_EQ(y[0], -8.0f);
}

TEST(GgmlBlocks, QuantizerInterface) {
  GgmlBlockQuantizer q8(GgmlType::q8_0, 64), q4(GgmlType::q4_0, 64);
  EXPECT_DOUBLE_EQ(q8.bits_per_element(), 8.5);
  EXPECT_DOUBLE_EQ(q4.bits_per_element(), 4.5);
  EXPECT_THROW(GgmlBlockQuantizer(GgmlType::q8_0, 48), Error);
  std::vector<float> x(3 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * i) * (1 + i % 7);
  std::vector<float> xh(x.size());
  q4.fake_quant(x.data(), 3, xh.data());
  std::vector<BlockQ4_0> b(6);
  std::vector<float> ref(x.size());
  quantize_row_q4_0_ref(x.data(), b.data(), x.size());
  dequantize_row_q4_0(b.data(), ref.data(), x.size());
  EXPECT_EQ(xh, ref);
  x[5] = INFINITY;
  EXPECT_THROW(q8.fake_quant(x.data(), 3, xh.data()), Error);
  std::vector<float> huge(32, 1.0f);
  huge[7] = 1e7f;  // q8_0 scale 1e7/127 > 65504
  std::vector<BlockQ8_0> b8(1);
  EXPECT_THROW(quantize_row_q8_0_ref(huge.data(), b8.data(), 32), Error);
  huge[7] = 1e5f;  // q8_0 scale fits (787), q4_0 scale 12500 fits too
  EXPECT_NO_THROW(quantize_row_q8_0_ref(huge.data(), b8.data(), 32));
  huge[7] = 6e5f;  // q4_0 scale 75000 overflows
  EXPECT_THROW(quantize_row_q4_0_ref(huge.data(), b.data(), 32), Error);
  EXPECT_THROW(quantize_row_q4_0_ref(huge.data(), b.data(), 31), Error);
}
