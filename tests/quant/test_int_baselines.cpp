// Integer baselines: the asymmetric / symmetric group primitive on hand-derived
// cases, KIVI keys/values, QuaRot.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/quant/int_quant.h"
#include "ratekv/quant/kivi.h"
#include "ratekv/quant/prng.h"
#include "ratekv/quant/quarot.h"
#include "ratekv/quant/rotation.h"

using namespace ratekv;
using namespace ratekv::quant;

// 2-bit asymmetric of {−1, 0, 0.5, 2}: z = −1, s = 3/3 = 1, codes {0,1,2,3}
// (0.5 → (1.5) → ties to even → 2), x̂ = {−1, 0, 1, 2}.
TEST(IntQuant, AsymmetricHandDerived) {
  const float x[4] = {-1.0f, 0.0f, 0.5f, 2.0f};
  uint8_t c[4];
  const auto p = quantize_asym(x, 4, 1, 2, c);
  EXPECT_EQ(p.zero, fp32_to_fp16(-1.0f));
  EXPECT_EQ(p.scale, fp32_to_fp16(1.0f));
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[1], 1);
  EXPECT_EQ(c[2], 2);
  EXPECT_EQ(c[3], 3);
  float y[4];
  dequantize_asym(c, 4, p, y, 1);
  EXPECT_EQ(y[2], 1.0f);
  // fp16 rounding of the zero is used for the codes: min 0.1 → z = fp16(0.1)
  const float x2[3] = {0.1f, 0.2f, 0.30000001f};
  const auto p2 = quantize_asym(x2, 3, 1, 1, c);
  EXPECT_EQ(fp16_to_fp32(p2.zero), round_fp16(0.1f));
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[2], 1);
  // Constant group: s = 0, all codes 0, exact reconstruction of fp16(z).
  const float k3[3] = {0.75f, 0.75f, 0.75f};
  const auto p3 = quantize_asym(k3, 3, 1, 4, c);
  dequantize_asym(c, 3, p3, y, 1);
  EXPECT_EQ(y[1], 0.75f);
  EXPECT_THROW(quantize_asym(k3, 3, 1, 0, c), Error);
  const float big[2] = {-70000.0f, 70000.0f};
  EXPECT_THROW(quantize_asym(big, 2, 1, 4, c), Error);
}

// 3-bit symmetric: L = 3, s = 1.5/3 = 0.5; x = {1.5, −0.74, 0.25, −1.5}
// → q = {3, −1, 0 (0.5 ties to even), −3} stored +3.
TEST(IntQuant, SymmetricHandDerived) {
  const float x[4] = {1.5f, -0.74f, 0.25f, -1.5f};
  uint8_t c[4];
  const auto p = quantize_sym(x, 4, 1, 3, c);
  EXPECT_EQ(p.scale, fp32_to_fp16(0.5f));
  EXPECT_EQ(c[0], 6);
  EXPECT_EQ(c[1], 2);
  EXPECT_EQ(c[2], 3);
  EXPECT_EQ(c[3], 0);
  float y[4];
  dequantize_sym(c, 4, 3, p, y, 1);
  EXPECT_EQ(y[1], -0.5f);
  EXPECT_THROW(quantize_sym(x, 4, 1, 1, c), Error);
}

// KIVI keys: per-channel over token groups; the T mod g newest rows are fp16.
TEST(KIVI, KeysPerChannelWithWindow) {
  const int d = 5, g = 4, T = 11;  // two full groups + 3 window rows
  SplitMix64 rng(3);
  std::vector<float> x(T * d), xh(T * d);
  for (auto& v : x) v = (float)rng.gaussian();
  KIVIKey k({.dim = d, .bits = 2, .group_size = g});
  k.fake_quant(x.data(), T, xh.data());
  for (int t0 = 0; t0 < 8; t0 += g)
    for (int c = 0; c < d; ++c) {
      float col[4], colh[4];
      uint8_t codes[4];
      for (int i = 0; i < g; ++i) col[i] = x[(t0 + i) * d + c];
      const auto p = quantize_asym(col, g, 1, 2, codes);
      dequantize_asym(codes, g, p, colh, 1);
      for (int i = 0; i < g; ++i) ASSERT_EQ(xh[(t0 + i) * d + c], colh[i]);
      // the column min and max are reproduced to fp16 rounding
    }
  for (int i = 8 * d; i < T * d; ++i) EXPECT_EQ(xh[i], round_fp16(x[i]));
  // bits: (8·5·2 + 2·5·32 + 3·5·16) / 55
  EXPECT_DOUBLE_EQ(k.bits_per_element(T), (80.0 + 320.0 + 240.0) / 55.0);
  EXPECT_DOUBLE_EQ(k.bits_per_element(), 2.0 + 32.0 / 4);
  EXPECT_EQ(k.scope(), QuantScope::per_channel_tokens);
  EXPECT_EQ(k.tokens_per_group(), 4);
  // group-aligned chunks give the same result as one call
  std::vector<float> xh2(T * d);
  k.fake_quant(x.data(), 4, xh2.data());
  k.fake_quant(x.data() + 4 * d, T - 4, xh2.data() + 4 * d);
  EXPECT_EQ(xh, xh2);
}

// A window (fp16) value beyond fp16's range is an error, as the other
// quantizers' fp16 scale overflows are (it was stored as inf: D = inf, no error).
TEST(KIVI, KeyWindowOverflowingFp16Throws) {
  const int d = 4, g = 4;
  KIVIKey k({.dim = d, .bits = 2, .group_size = g});
  std::vector<float> x(2 * d, 0.5f), xh(2 * d);
  x[d + 1] = 1e5f;  // row 1 of a 2-row window (fewer rows than a group)
  EXPECT_THROW(k.fake_quant(x.data(), 2, xh.data()), Error);
  x[d + 1] = 65504.f;  // fp16's largest finite value is fine
  k.fake_quant(x.data(), 2, xh.data());
  EXPECT_EQ(xh[d + 1], 65504.f);
}

TEST(KIVI, ValuesPerTokenChannelGroups) {
  const int d = 70, G = 32, T = 7;  // groups 32, 32, 6
  SplitMix64 rng(4);
  std::vector<float> x(T * d), xh(T * d);
  for (auto& v : x) v = (float)(3 * rng.gaussian());
  KIVIValue v({.dim = d, .bits = 3, .group_size = G});
  v.fake_quant(x.data(), T, xh.data());
  for (int t = 0; t < T; ++t)
    for (int c0 : {0, 32, 64}) {
      const int n = std::min(G, d - c0);
      std::vector<uint8_t> codes(n);
      std::vector<float> r(n);
      const auto p = quantize_asym(&x[t * d + c0], n, 1, 3, codes.data());
      dequantize_asym(codes.data(), n, p, r.data(), 1);
      for (int i = 0; i < n; ++i) ASSERT_EQ(xh[t * d + c0 + i], r[i]);
    }
  EXPECT_DOUBLE_EQ(v.bits_per_element(), 3.0 + 32.0 * 3 / 70);
}

// QuaRot: x̂ = Πᵀ Q(Π x) with the per-token symmetric quantizer, checked
// against an independent composition; distortion well below plain int at 4 bits
// on outlier-heavy rows.
TEST(QuaRot, HadamardThenPerTokenInt) {
  const int d = 64, T = 9;
  SplitMix64 rng(8);
  std::vector<float> x(T * d), xh(T * d);
  for (auto& v : x) v = (float)rng.gaussian();
  for (int t = 0; t < T; ++t) x[t * d + 5] = 40.0f;  // an outlier channel
  QuaRot q({.dim = d, .bits = 4, .seed = 6});
  q.fake_quant(x.data(), T, xh.data());
  Rotation r(RotationKind::hadamard, d, 6);
  double e_rot = 0, e_plain = 0;
  for (int t = 0; t < T; ++t) {
    std::vector<float> y(d), back(d), plain(d);
    std::vector<uint8_t> codes(d);
    r.apply(&x[t * d], y.data());
    const auto p = quantize_sym(y.data(), d, 1, 4, codes.data());
    dequantize_sym(codes.data(), d, 4, p, y.data(), 1);
    r.apply_transpose(y.data(), back.data());
    for (int i = 0; i < d; ++i) ASSERT_EQ(xh[t * d + i], back[i]);
    const auto p2 = quantize_sym(&x[t * d], d, 1, 4, codes.data());
    dequantize_sym(codes.data(), d, 4, p2, plain.data(), 1);
    for (int i = 0; i < d; ++i) {
      e_rot += std::pow(x[t * d + i] - xh[t * d + i], 2);
      e_plain += std::pow(x[t * d + i] - plain[i], 2);
    }
  }
  EXPECT_LT(e_rot, 0.5 * e_plain);
  EXPECT_DOUBLE_EQ(q.bits_per_element(), 4.25);
  EXPECT_DOUBLE_EQ(QuaRot({.dim = 64, .bits = 2, .symmetric = false, .group_size = 32}).bits_per_element(), 3.0);
  EXPECT_THROW(QuaRot({.dim = 64, .bits = 1}), Error);
  EXPECT_THROW(QuaRot({.dim = 96, .bits = 4}), Error);  // Hadamard needs 2^k
  EXPECT_EQ(make_quantizer({{"kind", "quarot"}, {"dim", 96}, {"bits", 4}})->to_json()["rotation"], "haar");
}
