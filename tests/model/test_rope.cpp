// RoPE: arch -> layout table, channel pairs, norm preservation per block,
// composition, relative-position property, inverse.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ratekv/common/error.h"
#include "ratekv/model/model.h"

using namespace ratekv;

namespace {

std::vector<float> random_vec(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g) + 0.1f;  // nonzero mean: no accidental zeros
  return v;
}

double block_norm(const float* x, std::array<int, 2> p) {
  return std::hypot(double{x[p[0]]}, double{x[p[1]]});
}

}  // namespace

TEST(Rope, ArchTable) {
  EXPECT_EQ(rope_layout_for_arch("llama"), RopeLayout::Interleaved);
  EXPECT_EQ(rope_layout_for_arch("gemma3"), RopeLayout::NeoX);
  EXPECT_EQ(rope_layout_for_arch("qwen2"), RopeLayout::NeoX);
  EXPECT_THROW(rope_layout_for_arch("mamba"), Error);
  try {
    rope_layout_for_arch("mamba");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mamba"), std::string::npos);
  }
}

TEST(Rope, Pairs) {
  auto il = rope_pairs(RopeLayout::Interleaved, 6);
  ASSERT_EQ(il.size(), 3u);
  EXPECT_EQ(il[0], (std::array<int, 2>{0, 1}));
  EXPECT_EQ(il[2], (std::array<int, 2>{4, 5}));
  auto nx = rope_pairs(RopeLayout::NeoX, 6);
  EXPECT_EQ(nx[0], (std::array<int, 2>{0, 3}));
  EXPECT_EQ(nx[2], (std::array<int, 2>{2, 5}));
  EXPECT_THROW(rope_pairs(RopeLayout::NeoX, 7), Error);
  EXPECT_THROW(rope_pairs(RopeLayout::NeoX, 0), Error);
  EXPECT_DOUBLE_EQ(rope_frequency(0, 64, 1e5), 1.0);
  EXPECT_NEAR(rope_frequency(16, 64, 1e5), std::pow(1e5, -0.5), 1e-15);
}

// A rotation of block i by angle pos·θ^(−2i/d): check the exact 2-D rotation
// on a hand-made vector (catches wrong pairing, sign or frequency).
TEST(Rope, ExactRotationOfOneBlock) {
  for (RopeLayout lay : {RopeLayout::Interleaved, RopeLayout::NeoX}) {
    const int d = 8;
    auto pairs = rope_pairs(lay, d);
    for (int i = 0; i < d / 2; ++i) {
      std::vector<float> x(d, 0.0f);
      x[pairs[i][0]] = 3.0f;
      x[pairs[i][1]] = -2.0f;
      const int64_t pos = 5;
      apply_rope(x.data(), 1, d, pos, lay, 100.0);
      const double a = pos * std::pow(100.0, -2.0 * i / d);
      EXPECT_NEAR(x[pairs[i][0]], 3.0 * std::cos(a) + 2.0 * std::sin(a), 1e-5) << i;
      EXPECT_NEAR(x[pairs[i][1]], 3.0 * std::sin(a) - 2.0 * std::cos(a), 1e-5) << i;
      for (int c = 0; c < d; ++c) {
        if (c != pairs[i][0] && c != pairs[i][1]) {
          EXPECT_EQ(x[c], 0.0f) << "channel " << c << " block " << i;
        }
      }
    }
  }
}

TEST(Rope, EveryBlockKeepsItsNorm) {
  for (RopeLayout lay : {RopeLayout::Interleaved, RopeLayout::NeoX}) {
    for (int d : {2, 64, 128, 256}) {
      auto pairs = rope_pairs(lay, d);
      for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{97}, int64_t{8191}}) {
        const int nv = 3;
        auto x = random_vec(nv * d, static_cast<uint32_t>(d * 131 + pos));
        auto y = x;
        apply_rope(y.data(), nv, d, pos, lay, 1e5);
        for (int v = 0; v < nv; ++v) {
          for (const auto& p : pairs) {
            const double n0 = block_norm(x.data() + v * d, p), n1 = block_norm(y.data() + v * d, p);
            ASSERT_NEAR(n1, n0, 1e-5 * (1 + n0)) << rope_layout_name(lay) << " d=" << d << " pos=" << pos;
          }
        }
        if (pos == 0) {
          for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]);
        } else {
          double diff = 0;
          for (size_t i = 0; i < x.size(); ++i) diff += std::fabs(x[i] - y[i]);
          EXPECT_GT(diff, 1e-3);  // it actually rotated
        }
      }
    }
  }
}

// Wrong pairing detector: rotating with the other layout's pairs changes block norms.
TEST(Rope, OtherLayoutBreaksBlockNorms) {
  const int d = 64;
  auto x = random_vec(d, 7);
  auto y = x;
  apply_rope(y.data(), 1, d, 1000, RopeLayout::NeoX, 1e5);
  auto il = rope_pairs(RopeLayout::Interleaved, d);
  double max_dev = 0;
  for (const auto& p : il) max_dev = std::max(max_dev, std::fabs(block_norm(x.data(), p) - block_norm(y.data(), p)));
  EXPECT_GT(max_dev, 0.1);
}

TEST(Rope, CompositionAndInverse) {
  for (RopeLayout lay : {RopeLayout::Interleaved, RopeLayout::NeoX}) {
    const int d = 64;
    for (auto [p1, p2] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {1, 1}, {37, 4000}, {8191, 1}}) {
      auto x = random_vec(2 * d, static_cast<uint32_t>(p1 + 3 * p2));
      auto a = x, b = x;
      apply_rope(a.data(), 2, d, p1, lay, 1e5);
      apply_rope(a.data(), 2, d, p2, lay, 1e5);
      apply_rope(b.data(), 2, d, p1 + p2, lay, 1e5);
      for (int i = 0; i < 2 * d; ++i) ASSERT_NEAR(a[i], b[i], 2e-5) << "p1=" << p1 << " p2=" << p2 << " i=" << i;
      apply_rope(b.data(), 2, d, p1 + p2, lay, 1e5, /*inverse=*/true);
      for (int i = 0; i < 2 * d; ++i) ASSERT_NEAR(b[i], x[i], 2e-5);
    }
  }
}

// <R_m q, R_n k> depends only on m − n.
TEST(Rope, DotProductDependsOnlyOnOffset) {
  for (RopeLayout lay : {RopeLayout::Interleaved, RopeLayout::NeoX}) {
    const int d = 64;
    auto q = random_vec(d, 11), k = random_vec(d, 12);
    auto dot_at = [&](int64_t m, int64_t n) {
      auto qq = q, kk = k;
      apply_rope(qq.data(), 1, d, m, lay, 1e5);
      apply_rope(kk.data(), 1, d, n, lay, 1e5);
      double s = 0;
      for (int i = 0; i < d; ++i) s += double{qq[i]} * kk[i];
      return s;
    };
    for (int64_t off : {int64_t{0}, int64_t{3}, int64_t{100}}) {
      const double ref = dot_at(off, 0);
      for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{4000}, 8191 - off}) EXPECT_NEAR(dot_at(n + off, n), ref, 1e-3) << "off " << off;
    }
    EXPECT_GT(std::fabs(dot_at(3, 0) - dot_at(100, 0)), 1e-3);  // offsets do matter
  }
}

TEST(Rope, BadArguments) {
  float x[4] = {1, 2, 3, 4};
  EXPECT_THROW(apply_rope(x, 1, 3, 1, RopeLayout::NeoX, 1e4), Error);
  EXPECT_THROW(apply_rope(x, 1, 4, 1, RopeLayout::NeoX, -1.0), Error);
  EXPECT_THROW(apply_rope(x, 1, 4, 1, RopeLayout::NeoX, std::nan("")), Error);
}
