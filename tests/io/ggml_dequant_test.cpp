// Dequantization of every supported ggml type on hand-built blocks.
//
// Two kinds of checks per type: (1) literal bytes whose decoded values were
// worked out by hand (pins the bit layout), (2) quants chosen by a fixed LCG,
// packed by an encoder written here from the layout description, then decoded
// and compared exactly with d*q(+m) evaluated in the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "io/ggml_blocks.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/io/gguf.h"

using namespace ratekv;
using namespace ratekv::ggml;

namespace {

constexpr uint16_t kHalf = 0x3800;      // 0.5
constexpr uint16_t kQuarter = 0x3400;   // 0.25
constexpr uint16_t kEighth = 0x3000;    // 0.125
constexpr uint16_t kMinus125 = 0xBD00;  // -1.25

struct Lcg {
  uint32_t s;
  int next(int mod) {
    s = s * 1664525u + 1013904223u;
    return (int)((s >> 8) % (uint32_t)mod);
  }
};

template <typename B>
std::vector<float> decode(GgmlType t, const std::vector<B>& blocks) {
  const int64_t n = (int64_t)blocks.size() * ggml_block_size(t);
  std::vector<float> y((size_t)n, -999.f);
  dequantize_row(t, blocks.data(), y.data(), n);
  return y;
}

// Packs 8 (scale, min) 6-bit pairs into the K-quant scales[12] layout.
void pack_scales_k4(const int sc[8], const int m[8], uint8_t out[12]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    out[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

}  // namespace

TEST(GgmlTypes, BlockSizesAndNames) {
  EXPECT_EQ(ggml_block_size(GgmlType::F32), 1);
  EXPECT_EQ(ggml_block_bytes(GgmlType::BF16), 2);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q4_1), 20);
  EXPECT_EQ(ggml_block_size(GgmlType::Q4_1), 32);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q5_0), 22);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q5_1), 24);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q8_0), 34);
  EXPECT_EQ(ggml_block_size(GgmlType::Q4_K), 256);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q4_K), 144);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q5_K), 176);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q6_K), 210);
  EXPECT_EQ(ggml_type_name(GgmlType::Q6_K), "Q6_K");
  EXPECT_EQ(ggml_type_name((GgmlType)99), "type#99");
  EXPECT_THROW(ggml_block_size((GgmlType)4), Error);
  EXPECT_TRUE(ggml_can_dequantize(GgmlType::BF16));
  EXPECT_FALSE(ggml_can_dequantize(GgmlType::Q2_K));
  try {
    float y[32];
    const uint8_t z[18] = {};
    dequantize_row(GgmlType::Q4_0, z, y, 31);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("31 elements is not a non-negative multiple of the Q4_0 block size 32"));
  }
  EXPECT_THROW(dequantize_row(GgmlType::I32, nullptr, nullptr, 0), Error);
}

TEST(GgmlDequant, FloatTypes) {
  const uint16_t h[5] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x8000};  // 1, -2, 2^-24, 65504, -0
  float y[5];
  dequantize_row(GgmlType::F16, h, y, 5);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 5.9604644775390625e-08f);
  EXPECT_EQ(y[3], 65504.0f);
  EXPECT_TRUE(y[4] == 0.0f && std::signbit(y[4]));
  const uint16_t b[3] = {0x3F80, 0xC0A0, 0x3E20};  // 1, -5, 0.15625
  dequantize_row(GgmlType::BF16, b, y, 3);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -5.0f);
  EXPECT_EQ(y[2], 0.15625f);
  const float f[3] = {1.5f, -0.0f, 3e38f};
  dequantize_row(GgmlType::F32, f, y, 3);
  EXPECT_EQ(std::memcmp(f, y, sizeof f), 0);
}

TEST(GgmlDequant, Q4_0) {
  BlockQ4_0 lit{};
  lit.d = kHalf;
  lit.qs[0] = 0x1F;  // weight 0 = 15, weight 16 = 1
  std::vector<float> y = decode(GgmlType::Q4_0, std::vector<BlockQ4_0>{lit});
  EXPECT_EQ(y[0], 3.5f);    // 0.5 * (15 - 8)
  EXPECT_EQ(y[16], -3.5f);  // 0.5 * (1 - 8)
  EXPECT_EQ(y[1], -4.0f);   // 0.5 * (0 - 8)

  Lcg r{1};
  std::vector<BlockQ4_0> bl(3);
  std::vector<int> q(96);
  const uint16_t ds[3] = {kHalf, kMinus125, kEighth};
  for (int b = 0; b < 3; ++b) {
    bl[b].d = ds[b];
    for (int j = 0; j < 32; ++j) q[32 * b + j] = r.next(16);
    for (int j = 0; j < 16; ++j) bl[b].qs[j] = (uint8_t)(q[32 * b + j] | (q[32 * b + j + 16] << 4));
  }
  y = decode(GgmlType::Q4_0, bl);
  const float dv[3] = {0.5f, -1.25f, 0.125f};
  for (int i = 0; i < 96; ++i) EXPECT_EQ(y[i], dv[i / 32] * (float)(q[i] - 8)) << i;
}

TEST(GgmlDequant, Q4_1) {
  BlockQ4_1 lit{};
  lit.d = kHalf;
  lit.m = kMinus125;
  lit.qs[0] = 0xF0;
  std::vector<float> y = decode(GgmlType::Q4_1, std::vector<BlockQ4_1>{lit});
  EXPECT_EQ(y[0], -1.25f);  // 0.5 * 0 - 1.25
  EXPECT_EQ(y[16], 6.25f);  // 0.5 * 15 - 1.25

  Lcg r{2};
  std::vector<BlockQ4_1> bl(2);
  std::vector<int> q(64);
  for (int b = 0; b < 2; ++b) {
    bl[b].d = b ? kQuarter : kHalf;
    bl[b].m = b ? 0x4000 : kMinus125;  // 2.0 / -1.25
    for (int j = 0; j < 32; ++j) q[32 * b + j] = r.next(16);
    for (int j = 0; j < 16; ++j) bl[b].qs[j] = (uint8_t)(q[32 * b + j] | (q[32 * b + j + 16] << 4));
  }
  y = decode(GgmlType::Q4_1, bl);
  for (int i = 0; i < 64; ++i) {
    const float d = i < 32 ? 0.5f : 0.25f, m = i < 32 ? -1.25f : 2.0f;
    EXPECT_EQ(y[i], d * (float)q[i] + m) << i;
  }
}

TEST(GgmlDequant, Q5_0) {
  BlockQ5_0 lit{};
  lit.d = kHalf;
  lit.qs[3] = 0x21;   // weight 3 low bits 1, weight 19 low bits 2
  lit.qh[0] = 0x08;   // bit 3: weight 3 gets its 5th bit; bit 19 clear
  std::vector<float> y = decode(GgmlType::Q5_0, std::vector<BlockQ5_0>{lit});
  EXPECT_EQ(y[3], 0.5f);    // 0.5 * (17 - 16)
  EXPECT_EQ(y[19], -7.0f);  // 0.5 * (2 - 16)

  Lcg r{3};
  std::vector<BlockQ5_0> bl(2);
  std::vector<int> q(64);
  for (int b = 0; b < 2; ++b) {
    bl[b].d = b ? kMinus125 : kHalf;
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) {
      q[32 * b + j] = r.next(32);
      qh |= (uint32_t)(q[32 * b + j] >> 4) << j;
    }
    for (int j = 0; j < 16; ++j) bl[b].qs[j] = (uint8_t)((q[32 * b + j] & 15) | ((q[32 * b + j + 16] & 15) << 4));
    for (int k = 0; k < 4; ++k) bl[b].qh[k] = (uint8_t)(qh >> (8 * k));
  }
  y = decode(GgmlType::Q5_0, bl);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(y[i], (i < 32 ? 0.5f : -1.25f) * (float)(q[i] - 16)) << i;
}

TEST(GgmlDequant, Q5_1) {
  BlockQ5_1 lit{};
  lit.d = kHalf;
  lit.m = kMinus125;
  lit.qs[0] = 0xFF;
  lit.qh[2] = 0x01;  // bit 16: weight 16's 5th bit
  std::vector<float> y = decode(GgmlType::Q5_1, std::vector<BlockQ5_1>{lit});
  EXPECT_EQ(y[0], 6.25f);    // 0.5 * 15 - 1.25
  EXPECT_EQ(y[16], 14.25f);  // 0.5 * 31 - 1.25
  EXPECT_EQ(y[5], -1.25f);

  Lcg r{4};
  std::vector<BlockQ5_1> bl(2);
  std::vector<int> q(64);
  for (int b = 0; b < 2; ++b) {
    bl[b].d = b ? kEighth : kHalf;
    bl[b].m = b ? 0x4000 : kMinus125;
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) {
      q[32 * b + j] = r.next(32);
      qh |= (uint32_t)(q[32 * b + j] >> 4) << j;
    }
    for (int j = 0; j < 16; ++j) bl[b].qs[j] = (uint8_t)((q[32 * b + j] & 15) | ((q[32 * b + j + 16] & 15) << 4));
    for (int k = 0; k < 4; ++k) bl[b].qh[k] = (uint8_t)(qh >> (8 * k));
  }
  y = decode(GgmlType::Q5_1, bl);
  for (int i = 0; i < 64; ++i) {
    const float d = i < 32 ? 0.5f : 0.125f, m = i < 32 ? -1.25f : 2.0f;
    EXPECT_EQ(y[i], d * (float)q[i] + m) << i;
  }
}

TEST(GgmlDequant, Q8_0) {
  BlockQ8_0 lit{};
  lit.d = kEighth;
  lit.qs[5] = -128;
  lit.qs[31] = 127;
  std::vector<float> y = decode(GgmlType::Q8_0, std::vector<BlockQ8_0>{lit});
  EXPECT_EQ(y[5], -16.0f);
  EXPECT_EQ(y[31], 15.875f);
  EXPECT_EQ(y[0], 0.0f);

  Lcg r{5};
  std::vector<BlockQ8_0> bl(3);
  std::vector<int> q(96);
  for (int b = 0; b < 3; ++b) {
    bl[b].d = b == 1 ? kMinus125 : kQuarter;
    for (int j = 0; j < 32; ++j) bl[b].qs[j] = (int8_t)(q[32 * b + j] = r.next(256) - 128);
  }
  y = decode(GgmlType::Q8_0, bl);
  for (int i = 0; i < 96; ++i) EXPECT_EQ(y[i], (i / 32 == 1 ? -1.25f : 0.25f) * (float)q[i]) << i;
}

TEST(GgmlDequant, Q4_K) {
  BlockQ4_K lit{};
  lit.d = kHalf;
  lit.dmin = kQuarter;
  lit.scales[1] = 0xC5;  // sub-block 1: scale 5; top bits 3 -> sub-block 5 scale bits 4..5
  lit.scales[5] = 0x42;  // sub-block 1: min 2; top bits 1 -> sub-block 5 min bit 4
  lit.scales[9] = 0x3A;  // sub-block 5: scale low nibble 0xA, min low nibble 3
  lit.qs[0] = 0x70;      // group 0 high nibble -> sub-block 1, element 32
  lit.qs[64] = 0x70;     // group 2 high nibble -> sub-block 5, element 160
  lit.qs[65] = 0x03;     // group 2 low nibble -> sub-block 4, element 129
  std::vector<float> y = decode(GgmlType::Q4_K, std::vector<BlockQ4_K>{lit});
  EXPECT_EQ(y[32], 17.0f);      // 0.5*5*7 - 0.25*2
  EXPECT_EQ(y[33], -0.5f);      // 0.5*5*0 - 0.25*2
  EXPECT_EQ(y[160], 198.25f);   // scale 58, min 19: 0.5*58*7 - 0.25*19
  EXPECT_EQ(y[161], -4.75f);
  EXPECT_EQ(y[129], 0.0f);      // sub-block 4: scale 0, min 0

  Lcg r{6};
  std::vector<BlockQ4_K> bl(2);
  std::vector<int> q(512), sc(16), mn(16);
  for (int b = 0; b < 2; ++b) {
    bl[b].d = b ? kEighth : kHalf;
    bl[b].dmin = b ? kHalf : kQuarter;
    for (int s = 0; s < 8; ++s) {
      sc[8 * b + s] = r.next(64);
      mn[8 * b + s] = r.next(64);
    }
    pack_scales_k4(&sc[8 * b], &mn[8 * b], bl[b].scales);
    for (int i = 0; i < 256; ++i) q[256 * b + i] = r.next(16);
    for (int i = 0; i < 256; ++i) {
      const int s = i / 32, l = i % 32;
      uint8_t& byte = bl[b].qs[32 * (s / 2) + l];
      byte |= (uint8_t)(s % 2 ? q[256 * b + i] << 4 : q[256 * b + i]);
    }
  }
  y = decode(GgmlType::Q4_K, bl);
  for (int i = 0; i < 512; ++i) {
    const int b = i / 256, s = (i % 256) / 32;
    const float d = b ? 0.125f : 0.5f, dmin = b ? 0.5f : 0.25f;
    const float dsc = d * (float)sc[8 * b + s], mm = dmin * (float)mn[8 * b + s];
    EXPECT_EQ(y[i], dsc * (float)q[i] - mm) << i;
  }
}

TEST(GgmlDequant, Q5_K) {
  BlockQ5_K lit{};
  lit.d = kHalf;
  lit.dmin = kQuarter;
  lit.scales[1] = 0xC5;
  lit.scales[5] = 0x42;
  lit.scales[9] = 0x3A;
  lit.qs[64] = 0x70;   // element 160, low bits 7
  lit.qh[0] = 0x20;    // bit 5 of qh[0]: sub-block 5, l = 0 -> +16
  lit.qh[1] = 0x02;    // bit 1 of qh[1]: sub-block 1, l = 1 (element 33) -> +16
  std::vector<float> y = decode(GgmlType::Q5_K, std::vector<BlockQ5_K>{lit});
  EXPECT_EQ(y[160], 662.25f);  // 0.5*58*23 - 0.25*19
  EXPECT_EQ(y[33], 39.5f);     // 0.5*5*16 - 0.25*2
  EXPECT_EQ(y[32], -0.5f);

  Lcg r{7};
  std::vector<BlockQ5_K> bl(2);
  std::vector<int> q(512), sc(16), mn(16);
  for (int b = 0; b < 2; ++b) {
    bl[b].d = b ? kQuarter : kHalf;
    bl[b].dmin = b ? kEighth : kQuarter;
    for (int s = 0; s < 8; ++s) {
      sc[8 * b + s] = r.next(64);
      mn[8 * b + s] = r.next(64);
    }
    pack_scales_k4(&sc[8 * b], &mn[8 * b], bl[b].scales);
    for (int i = 0; i < 256; ++i) {
      const int v = q[256 * b + i] = r.next(32);
      const int s = i / 32, l = i % 32;
      bl[b].qs[32 * (s / 2) + l] |= (uint8_t)(s % 2 ? (v & 15) << 4 : (v & 15));
      bl[b].qh[l] |= (uint8_t)((v >> 4) << s);
    }
  }
  y = decode(GgmlType::Q5_K, bl);
  for (int i = 0; i < 512; ++i) {
    const int b = i / 256, s = (i % 256) / 32;
    const float d = b ? 0.25f : 0.5f, dmin = b ? 0.125f : 0.25f;
    EXPECT_EQ(y[i], d * (float)sc[8 * b + s] * (float)q[i] - dmin * (float)mn[8 * b + s]) << i;
  }
}

TEST(GgmlDequant, Q6_K) {
  BlockQ6_K lit{};
  lit.d = kHalf;
  lit.scales[11] = -3;
  lit.scales[15] = 2;
  lit.ql[112] = 0x05;  // half 1, byte 32+16: element 128+48 low nibble, element 128+112 high nibble
  lit.qh[48] = 0x08;   // half 1, l = 16: bits 2..3 = 2 -> element 176 top bits
  std::vector<float> y = decode(GgmlType::Q6_K, std::vector<BlockQ6_K>{lit});
  EXPECT_EQ(y[176], -7.5f);  // 0.5 * -3 * ((5 | 2<<4) - 32)
  EXPECT_EQ(y[240], -32.0f);  // 0.5 * 2 * (0 - 32)
  EXPECT_EQ(y[0], -0.0f);     // scale 0

  Lcg r{8};
  std::vector<BlockQ6_K> bl(2);
  std::vector<int> q(512), sc(32);
  for (int b = 0; b < 2; ++b) {
    bl[b].d = b ? kMinus125 : kHalf;
    for (int s = 0; s < 16; ++s) bl[b].scales[s] = (int8_t)(sc[16 * b + s] = r.next(256) - 128);
    for (int i = 0; i < 256; ++i) {
      const int v = q[256 * b + i] = r.next(64);
      const int h = i / 128, rr = i % 128, quad = rr / 32, l = rr % 32;
      uint8_t& lo = bl[b].ql[64 * h + (quad % 2) * 32 + l];
      lo |= (uint8_t)(quad < 2 ? (v & 15) : (v & 15) << 4);
      bl[b].qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * quad));
    }
  }
  y = decode(GgmlType::Q6_K, bl);
  for (int i = 0; i < 512; ++i) {
    const int b = i / 256, s = (i % 256) / 16;
    const float d = b ? -1.25f : 0.5f;
    EXPECT_EQ(y[i], d * (float)sc[16 * b + s] * (float)(q[i] - 32)) << i;
  }
}
