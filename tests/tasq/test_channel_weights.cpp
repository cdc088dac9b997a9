// Query-guided channel weights: prefix-sum accumulator vs the definition
// (explicit rotations over every causal pair), closed forms, normalization.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../support/tiny_model.h"
#include "ratekv/common/error.h"
#include "ratekv/tasq/channel_weights.h"

using namespace ratekv;
using namespace ratekv::tasq;

namespace {

// 2 layers, 6 query / 2 KV heads (GQA 3), head_dim d, context 256, θ = 50.
ModelConfig small_config(RopeLayout layout, int d) {
  return ratekv_test::tiny_config({.n_layers = 2,
                                   .n_heads = 6,
                                   .n_kv_heads = 2,
                                   .head_dim = d,
                                   .d_model = 16,
                                   .d_ff = 8,
                                   .n_vocab = 10,
                                   .n_ctx = 256,
                                   .rope_theta = 50.0},
                                  layout);
}

}  // namespace

TEST(ChannelWeights, PrefixSumsEqualDefinition) {
  for (RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::NeoX})
    for (int64_t T : {1, 2, 97}) {
      const ModelConfig c = small_config(layout, 10);
      std::mt19937 rng(static_cast<uint32_t>(T) + 3);
      QueryWeightAccumulator acc(c);
      std::vector<std::vector<float>> q(2);
      std::vector<int32_t> pos(T);
      for (int64_t i = 0; i < T; ++i) pos[i] = static_cast<int32_t>(i);
      for (int l = 0; l < 2; ++l) {
        q[l] = ratekv_test::randn(T * 6 * 10, rng, 1.5f, 0.2f);
        LayerActivations a;
        a.layer = l;
        a.n = T;
        a.pos = pos.data();
        a.n_heads = 6;
        a.n_kv_heads = 2;
        a.head_dim = 10;
        a.q_pre = q[l].data();
        acc.add(a);
      }
      const std::vector<double> w = acc.finish();
      for (int l = 0; l < 2; ++l) {
        const auto ref = query_weights_bruteforce(q[l].data(), T, 6, 2, 10, layout, 50.0);
        for (int i = 0; i < 20; ++i) EXPECT_NEAR(w[l * 20 + i], ref[i], 1e-9 * (1 + ref[i])) << T << " " << i;
      }
    }
}

TEST(ChannelWeights, SingleTokenIsQuerySecondMomentAndChunksAdd) {
  // T = 1: only Δ = 0, so w = mean over the GQA group of q².
  const ModelConfig c = small_config(RopeLayout::Interleaved, 4);
  QueryWeightAccumulator acc(c);
  std::vector<float> q(6 * 4);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.5f * static_cast<float>(i) - 3.0f;
  int32_t p0 = 0;
  for (int l = 0; l < 2; ++l) {
    LayerActivations a;
    a.layer = l, a.n = 1, a.pos = &p0, a.n_heads = 6, a.n_kv_heads = 2, a.head_dim = 4, a.q_pre = q.data();
    acc.add(a);
  }
  const auto w = acc.finish();
  for (int h = 0; h < 2; ++h)
    for (int ch = 0; ch < 4; ++ch) {
      double e = 0;
      for (int g = 3 * h; g < 3 * h + 3; ++g) e += double(q[g * 4 + ch]) * q[g * 4 + ch];
      EXPECT_NEAR(w[h * 4 + ch], e / 3.0, 1e-12);
    }
  // A low-frequency pair barely rotates: over a short window its two channels
  // keep different weights when the query energy is uneven.
  const ModelConfig c2 = small_config(RopeLayout::Interleaved, 64);
  QueryWeightAccumulator acc2(c2);
  std::vector<float> q2(8 * 6 * 64, 0.0f);
  std::vector<int32_t> pos(8);
  for (int t = 0; t < 8; ++t) {
    pos[t] = t;
    for (int g = 0; g < 6; ++g) q2[(t * 6 + g) * 64 + 62] = 3.0f;  // channel a of the last (slowest) pair
  }
  for (int l = 0; l < 2; ++l) {
    LayerActivations a;
    a.layer = l, a.n = 8, a.pos = pos.data(), a.n_heads = 6, a.n_kv_heads = 2, a.head_dim = 64, a.q_pre = q2.data();
    acc2.add(a);
  }
  const auto w2 = acc2.finish();
  // Closed form: 9·mean cos²(ωΔ) and 9·mean sin²(ωΔ) over the 36 causal pairs.
  double ca = 0, cb = 0;
  const double om = std::pow(50.0, -62.0 / 64.0);
  for (int t = 0; t < 8; ++t)
    for (int p = 0; p <= t; ++p) ca += 9 * std::cos(om * (t - p)) * std::cos(om * (t - p)), cb += 9 * std::sin(om * (t - p)) * std::sin(om * (t - p));
  EXPECT_NEAR(w2[62], ca / 36, 1e-9);
  EXPECT_NEAR(w2[63], cb / 36, 1e-9);
  EXPECT_GT(w2[62], 100 * w2[63]);
}

TEST(ChannelWeights, NormalizeUnitMean) {
  std::vector<double> w{1, 3, 0, 0, 2, 2};
  normalize_unit_mean(w, 2);
  EXPECT_DOUBLE_EQ(w[0], 0.5);
  EXPECT_DOUBLE_EQ(w[1], 1.5);
  EXPECT_DOUBLE_EQ(w[2], 1.0);  // all-zero head → ones
  EXPECT_DOUBLE_EQ(w[3], 1.0);
  EXPECT_DOUBLE_EQ(w[4], 1.0);
  std::vector<double> bad{1, -1};
  EXPECT_THROW(normalize_unit_mean(bad, 2), Error);
  std::vector<double> ragged{1, 2, 3};
  EXPECT_THROW(normalize_unit_mean(ragged, 2), Error);
}

TEST(ChannelWeights, BadActivationsAreErrors) {
  const ModelConfig c = small_config(RopeLayout::Interleaved, 4);
  QueryWeightAccumulator acc(c);
  EXPECT_THROW(acc.finish(), Error);  // nothing seen
  std::vector<float> q(6 * 4, 1.0f);
  int32_t p = -1;
  LayerActivations a;
  a.layer = 0, a.n = 1, a.pos = &p, a.n_heads = 6, a.n_kv_heads = 2, a.head_dim = 4, a.q_pre = q.data();
  EXPECT_THROW(acc.add(a), Error);
  p = 0;
  a.head_dim = 6;
  EXPECT_THROW(acc.add(a), Error);
  a.head_dim = 4;
  a.layer = 2;
  EXPECT_THROW(acc.add(a), Error);
}
