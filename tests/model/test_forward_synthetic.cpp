// Forward pass on a tiny random Llama model (no assets needed): prefill vs
// token-by-token decode vs chunked prefill, hooks, and input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ratekv/common/error.h"
#include "ratekv/model/model.h"
#include "../support/tiny_model.h"

using namespace ratekv;

namespace {

// Awkward sizes on purpose: d_model 20 ≠ n_heads·head_dim 24, odd d_ff and vocab.
using ratekv_test::randn;
using ratekv_test::tiny_model;

const std::vector<int32_t> kTokens = {3, 36, 0, 17, 17, 5, 22, 9, 1, 30, 11};

}  // namespace

TEST(ForwardSynthetic, PrefillEqualsDecodeAndChunks) {
  Model m = tiny_model();
  const int V = m.config().n_vocab;
  const int64_t n = static_cast<int64_t>(kTokens.size());
  auto c1 = m.make_dense_cache(64);
  std::vector<float> full(n * V);
  m.forward(kTokens, 0, c1, full.data(), true);
  EXPECT_EQ(c1.n_tokens(), n);
  // Token by token.
  auto c2 = m.make_dense_cache(64);
  std::vector<float> one(V);
  for (int64_t i = 0; i < n; ++i) {
    m.forward(std::span<const int32_t>(kTokens).subspan(i, 1), i, c2, one.data(), false);
    for (int j = 0; j < V; ++j) ASSERT_NEAR(one[j], full[i * V + j], 1e-4) << "token " << i << " vocab " << j;
  }
  // Chunks 4 + 7, last-token logits only.
  auto c3 = m.make_dense_cache(64);
  m.forward(std::span<const int32_t>(kTokens).subspan(0, 4), 0, c3, nullptr, false);
  m.forward(std::span<const int32_t>(kTokens).subspan(4), 4, c3, one.data(), false);
  for (int j = 0; j < V; ++j) ASSERT_NEAR(one[j], full[(n - 1) * V + j], 1e-4);
  // Logits are not degenerate.
  float mn = full[0], mx = full[0];
  for (float x : full) mn = std::min(mn, x), mx = std::max(mx, x);
  EXPECT_GT(mx - mn, 1.0f);
}

TEST(ForwardSynthetic, CausalPrefixUnaffectedByLaterTokens) {
  Model m = tiny_model();
  const int V = m.config().n_vocab;
  auto a = m.make_dense_cache(64), b = m.make_dense_cache(64);
  std::vector<int32_t> t2 = kTokens;
  t2.back() = 2;  // change only the last token
  std::vector<float> la(kTokens.size() * V), lb(kTokens.size() * V);
  m.forward(kTokens, 0, a, la.data(), true);
  m.forward(t2, 0, b, lb.data(), true);
  for (size_t i = 0; i + 1 < kTokens.size(); ++i)
    for (int j = 0; j < V; ++j) ASSERT_FLOAT_EQ(la[i * V + j], lb[i * V + j]);
  double diff = 0;
  for (int j = 0; j < V; ++j) diff += std::fabs(la[(kTokens.size() - 1) * V + j] - lb[(kTokens.size() - 1) * V + j]);
  EXPECT_GT(diff, 1e-3);
}

TEST(ForwardSynthetic, HooksSeeRopeConsistentQKV) {
  Model m = tiny_model();
  const ModelConfig& c = m.config();
  int calls = 0;
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    EXPECT_EQ(a.layer, calls);
    ++calls;
    ASSERT_EQ(a.n, 5);
    EXPECT_EQ(a.n_heads, c.n_heads);
    EXPECT_EQ(a.n_kv_heads, c.n_kv_heads);
    for (int64_t i = 0; i < a.n; ++i) {
      EXPECT_EQ(a.pos[i], 7 + i);
      std::vector<float> q(a.q_pre + i * c.n_heads * c.head_dim, a.q_pre + (i + 1) * c.n_heads * c.head_dim);
      std::vector<float> k(a.k_pre + i * c.n_kv_heads * c.head_dim, a.k_pre + (i + 1) * c.n_kv_heads * c.head_dim);
      apply_rope(q.data(), c.n_heads, c.head_dim, a.pos[i], c.rope_layout, c.rope_theta);
      apply_rope(k.data(), c.n_kv_heads, c.head_dim, a.pos[i], c.rope_layout, c.rope_theta);
      for (size_t j = 0; j < q.size(); ++j) ASSERT_NEAR(q[j], a.q_post[i * q.size() + j], 1e-5);
      for (size_t j = 0; j < k.size(); ++j) ASSERT_NEAR(k[j], a.k_post[i * k.size() + j], 1e-5);
      double dq = 0;
      for (size_t j = 0; j < q.size(); ++j) dq += std::fabs(a.q_pre[i * q.size() + j] - a.q_post[i * q.size() + j]);
      EXPECT_GT(dq, 1e-4);  // positions 7.. really rotate
    }
  };
  auto cache = m.make_dense_cache(64);
  std::vector<float> warm(7 * 1);
  m.forward(std::span<const int32_t>(kTokens).subspan(0, 7), 0, cache, nullptr, false);
  m.forward(std::span<const int32_t>(kTokens).subspan(2, 5), 7, cache, nullptr, false, &hooks);
  EXPECT_EQ(calls, c.n_layers);
}

TEST(ForwardSynthetic, InputErrors) {
  Model m = tiny_model();
  auto cache = m.make_dense_cache(128);
  std::vector<int32_t> bad = {1, 37};
  EXPECT_THROW(m.forward(bad, 0, cache, nullptr, false), Error);
  std::vector<int32_t> neg = {-1};
  EXPECT_THROW(m.forward(neg, 0, cache, nullptr, false), Error);
  EXPECT_THROW(m.forward(std::span<const int32_t>(), 0, cache, nullptr, false), Error);
  // Positions past n_ctx_train (64) are refused unless explicitly allowed.
  std::vector<int32_t> t = {1, 2};
  EXPECT_THROW(m.forward(t, 63, cache, nullptr, false), Error);
  m.set_position_limit(100);
  EXPECT_NO_THROW(m.forward(t, 63, cache, nullptr, false));
  // Cache of another shape.
  DenseKVCache other(KVCacheShape{2, 4, 2, 6, 64});
  EXPECT_THROW(m.forward(t, 0, other, nullptr, false), Error);
}

TEST(ForwardSynthetic, NonFiniteActivationNamesTheLayer) {
  ModelConfig c = tiny_model().config();
  Model good = tiny_model();
  ModelWeights w = good.weights();
  w.layers[1].w_down[5] = std::numeric_limits<float>::infinity();
  Model m = Model::from_weights(c, std::move(w));
  auto cache = m.make_dense_cache(64);
  try {
    m.forward(kTokens, 0, cache, nullptr, false);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
  }
}

TEST(ForwardSynthetic, FromWeightsValidates) {
  ModelConfig c = tiny_model().config();
  ModelWeights w = tiny_model().weights();
  w.layers[2].wo.pop_back();
  EXPECT_THROW(Model::from_weights(c, w), Error);
  ModelConfig c2 = c;
  c2.n_kv_heads = 3;  // does not divide 4
  EXPECT_THROW(Model::from_weights(c2, tiny_model().weights()), Error);
  ModelConfig c3 = c;
  c3.rope_theta = -1;
  EXPECT_THROW(Model::from_weights(c3, tiny_model().weights()), Error);
}
