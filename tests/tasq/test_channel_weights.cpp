// Query-guided channel weights: the prefix-sum accumulator against the
// definition — the mean squared change of a real attention logit
// (R_t q_t)·(R_p k_p) when the pre-RoPE key at p moves by a unit step in one
// channel, rotations by the model's own apply_rope, over the query/key pairs
// each layer's attention sees (causal, and inside the window of a sliding
// layer, each layer with its own RoPE base) — closed forms, normalization.
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

// diag(Ã) of one window of layer `l` by the definition: for every pair
// (query t, key p) the layer attends to — p ≤ t and, for a sliding layer,
// t − p < window (AttnParams: "a query at t sees keys at > t − window") — and
// every channel c, the change of the logit (R_t q_{g,t})·(R_p k_p) when
// k_p[c] grows by 1, squared; averaged over pairs and the GQA group. RoPE is
// the model's apply_rope at the true positions with base θ; k (T, Hkv, d)
// are real keys (the change is exact: the logit is linear in k).
std::vector<double> logit_error_weights(const float* q_pre, const float* k_pre, int64_t T, int H, int Hkv, int d,
                                        RopeLayout layout, double theta, int64_t window) {
  const int gqa = H / Hkv;
  std::vector<double> w(static_cast<size_t>(Hkv) * d, 0.0), n(Hkv, 0.0);
  std::vector<float> qt(d), kp(d), kp1(d);
  for (int64_t t = 0; t < T; ++t)
    for (int g = 0; g < H; ++g) {
      std::copy(q_pre + (t * H + g) * d, q_pre + (t * H + g + 1) * d, qt.begin());
      apply_rope(qt.data(), 1, d, t, layout, theta);
      const int h = g / gqa;
      for (int64_t p = 0; p <= t; ++p) {
        if (window > 0 && t - p >= window) continue;
        std::copy(k_pre + (p * Hkv + h) * d, k_pre + (p * Hkv + h + 1) * d, kp.begin());
        apply_rope(kp.data(), 1, d, p, layout, theta);
        double base = 0;
        for (int j = 0; j < d; ++j) base += double{qt[j]} * kp[j];
        for (int c = 0; c < d; ++c) {
          std::copy(k_pre + (p * Hkv + h) * d, k_pre + (p * Hkv + h + 1) * d, kp1.begin());
          kp1[c] += 1.0f;
          apply_rope(kp1.data(), 1, d, p, layout, theta);
          double moved = 0;
          for (int j = 0; j < d; ++j) moved += double{qt[j]} * kp1[j];
          w[static_cast<size_t>(h) * d + c] += (moved - base) * (moved - base);
        }
        n[h] += 1.0;
      }
    }
  for (int h = 0; h < Hkv; ++h)
    for (int c = 0; c < d; ++c) w[static_cast<size_t>(h) * d + c] /= n[h];
  return w;
}

// A layer's RoPE base and window, stated here (not read back from the config
// accessors the accumulator uses).
struct LayerRope {
  double theta;
  int64_t window;  // 0 = global
};

// Feeds random queries of each layer (offsets 0..T−1, one window) to the
// accumulator and compares with logit_error_weights per layer.
void expect_matches_definition(const ModelConfig& c, const std::vector<LayerRope>& spec, int64_t T, uint32_t seed) {
  const int H = c.n_heads, Hkv = c.n_kv_heads, d = c.head_dim;
  std::mt19937 rng(seed);
  QueryWeightAccumulator acc(c);
  std::vector<std::vector<float>> q(c.n_layers), k(c.n_layers);
  std::vector<int32_t> pos(T);
  for (int64_t i = 0; i < T; ++i) pos[i] = static_cast<int32_t>(i);
  for (int l = 0; l < c.n_layers; ++l) {
    q[l] = ratekv_test::randn(T * H * d, rng, 1.5f, 0.2f);
    k[l] = ratekv_test::randn(T * Hkv * d, rng, 0.3f);
    LayerActivations a;
    a.layer = l;
    a.n = T;
    a.pos = pos.data();
    a.n_heads = H;
    a.n_kv_heads = Hkv;
    a.head_dim = d;
    a.q_pre = q[l].data();
    acc.add(a);
  }
  const std::vector<double> w = acc.finish();
  for (int l = 0; l < c.n_layers; ++l) {
    const auto ref = logit_error_weights(q[l].data(), k[l].data(), T, H, Hkv, d, c.rope_layout, spec[l].theta,
                                         spec[l].window);
    double worst = 0;
    for (int i = 0; i < Hkv * d; ++i) {
      const double got = w[static_cast<size_t>(l) * Hkv * d + i];
      worst = std::max(worst, std::abs(got - ref[i]) / (1e-6 + ref[i]));
    }
    EXPECT_LT(worst, 2e-5) << "layer " << l << " T " << T;
  }
}

}  // namespace

TEST(ChannelWeights, PrefixSumsEqualLogitErrorDefinition) {
  for (RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::NeoX})
    for (int64_t T : {1, 2, 97}) {
      SCOPED_TRACE(testing::Message() << rope_layout_name(layout) << " T " << T);
      expect_matches_definition(small_config(layout, 10), {{50.0, 0}, {50.0, 0}}, T, static_cast<uint32_t>(T) + 3);
    }
}

// Gemma 3's shape of attention: sliding-window layers with their own RoPE
// base beside global layers. Layers 0 and 2 slide (window 5, θ 10), layer 1
// is global (θ 1000); head_dim 8, GQA 3. Windows of 1, 4 (inside the window),
// 5, 6 and 40 tokens. (The accumulator that used the global base and every
// causal pair for every layer fails this for T > 1.)
TEST(ChannelWeights, SlidingLayersUseTheirWindowAndBase) {
  ModelConfig c = ratekv_test::tiny_config({.n_layers = 3,
                                            .n_heads = 6,
                                            .n_kv_heads = 2,
                                            .head_dim = 8,
                                            .d_model = 16,
                                            .d_ff = 8,
                                            .n_vocab = 10,
                                            .n_ctx = 256,
                                            .rope_theta = 1000.0},
                                           RopeLayout::NeoX);
  c.arch = "gemma3";
  c.sliding_window = 5;
  c.layer_sliding = {1, 0, 1};
  c.rope_theta_swa = 10.0;
  for (int64_t T : {1, 4, 5, 6, 40}) expect_matches_definition(c, {{10.0, 5}, {1000.0, 0}, {10.0, 5}}, T, 70 + T);
}

// The definition is not symmetric in the rotation's direction: the weights
// of R_{t−p} (the logit's) differ from those of R_{p−t} once queries have
// correlated pair channels, so a sign error in the accumulator cannot pass
// the comparisons above.
TEST(ChannelWeights, RotationDirectionMatters) {
  const int d = 4, T = 12;
  std::vector<float> q(T * d), k(T * d, 0.0f);
  for (int t = 0; t < T; ++t) {  // q_a = q_b: every query leans along a + b
    q[t * d + 0] = q[t * d + 2] = 1.0f;
    q[t * d + 1] = q[t * d + 3] = 2.0f;
  }
  const auto fwd = logit_error_weights(q.data(), k.data(), T, 1, 1, d, RopeLayout::NeoX, 3.0, 0);
  // R_{p−t}: the same sums with the query rotated backwards.
  std::vector<double> back(d, 0.0);
  for (int t = 0; t < T; ++t)
    for (int p = 0; p <= t; ++p)
      for (int c = 0; c < d; ++c) {
        std::vector<float> e(d, 0.0f), qt(q.begin() + t * d, q.begin() + (t + 1) * d);
        e[c] = 1.0f;
        apply_rope(e.data(), 1, d, t, RopeLayout::NeoX, 3.0);   // R_t e
        apply_rope(qt.data(), 1, d, p, RopeLayout::NeoX, 3.0);  // R_p q
        double x = 0;
        for (int j = 0; j < d; ++j) x += double{qt[j]} * e[j];
        back[c] += x * x / (T * (T + 1) / 2);
      }
  double gap = 0;
  for (int c = 0; c < d; ++c) gap = std::max(gap, std::abs(fwd[c] - back[c]) / fwd[c]);
  EXPECT_GT(gap, 0.05);
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
