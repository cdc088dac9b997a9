// ratekv/model/attention_state.h: the online-softmax state and its merge give
// the softmax attention output of the whole row (computed here in double from
// the definition), whatever the split of the keys and the order of the parts;
// key_range and attention_logit by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ratekv/model/attention_state.h"

using namespace ratekv;

namespace {

// Σ_t softmax(s)_t v_t (T, len) in double, by the definition.
std::vector<double> softmax_output(const std::vector<float>& s, const std::vector<float>& v, int len) {
  double mx = -INFINITY, l = 0;
  for (float x : s) mx = std::max(mx, double{x});
  std::vector<double> o(len, 0.0);
  for (size_t t = 0; t < s.size(); ++t) {
    const double e = std::exp(double{s[t]} - mx);
    l += e;
    for (int i = 0; i < len; ++i) o[i] += e * v[t * len + i];
  }
  for (double& x : o) x /= l;
  return o;
}

// One part: keys [a, b) added one at a time (raise_max, then e^{s − m}).
SoftmaxState online(const std::vector<float>& s, const std::vector<float>& v, int len, size_t a, size_t b,
                    std::vector<float>& o) {
  SoftmaxState st;
  o.assign(len, 0.0f);
  for (size_t t = a; t < b; ++t) {
    if (s[t] > st.m) {
      const float alpha = st.raise_max(s[t]);
      for (float& x : o) x *= alpha;
    }
    const float e = std::exp(s[t] - st.m);
    st.l += e;
    for (int i = 0; i < len; ++i) o[i] += e * v[t * len + i];
  }
  return st;
}

TEST(SoftmaxState, MergedPartsEqualTheWholeRowSoftmax) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (size_t T : {1u, 2u, 97u, 300u}) {
    const int len = 5;
    std::vector<float> s(T), v(T * len);
    for (float& x : s) x = nd(rng);
    for (float& x : v) x = nd(rng) + 0.5f;
    const std::vector<double> want = softmax_output(s, v, len);
    // Parts of unequal size, one of them empty, merged in both orders.
    const std::vector<size_t> cuts = {0, T / 3, T / 3, T - T / 5, T};
    for (bool reverse : {false, true}) {
      SoftmaxState acc;
      std::vector<float> o(len, 0.0f), ob;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        const size_t p = reverse ? cuts.size() - 2 - k : k;
        const SoftmaxState part = online(s, v, len, cuts[p], cuts[p + 1], ob);
        acc.merge(part, o.data(), ob.data(), len);
      }
      for (int i = 0; i < len; ++i)
        EXPECT_NEAR(o[i] / acc.l, want[i], 2e-5 * (1 + std::abs(want[i]))) << "T " << T << " i " << i;
    }
  }
}

TEST(SoftmaxState, EmptyStatesMergeAsNothing) {
  SoftmaxState a, b;
  std::vector<float> oa = {1, 2}, ob = {3, 4};
  a.merge(b, oa.data(), ob.data(), 2);  // both empty: a stays empty
  EXPECT_EQ(a.m, -INFINITY);
  EXPECT_EQ(a.l, 0.0f);
  b = {2.0f, 1.5f};
  a.merge(b, oa.data(), ob.data(), 2);  // empty a takes b
  EXPECT_EQ(a.m, 2.0f);
  EXPECT_EQ(a.l, 1.5f);
  EXPECT_EQ(oa, (std::vector<float>{3, 4}));
  a.merge(SoftmaxState{}, oa.data(), ob.data(), 2);  // merging an empty b changes nothing
  EXPECT_EQ(a.l, 1.5f);
  EXPECT_EQ(oa, (std::vector<float>{3, 4}));
  SoftmaxState c;
  EXPECT_EQ(c.raise_max(1.0f), 0.0f);  // an empty state has nothing to rescale
  EXPECT_EQ(c.raise_max(1.0f), 1.0f);
  EXPECT_FLOAT_EQ(c.raise_max(3.0f), std::exp(-2.0f));
}

TEST(AttentionState, KeyRangeAndLogit) {
  const std::vector<int32_t> pos = {0, 1, 2, 5, 6, 9};
  int64_t lo = -1, hi = -1;
  key_range(pos, 5, 0, lo, hi);  // causal: positions ≤ 5
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 4);
  key_range(pos, 6, 4, lo, hi);  // window 4: positions in (2, 6]
  EXPECT_EQ(lo, 3);
  EXPECT_EQ(hi, 5);
  key_range(pos, 9, 1, lo, hi);  // window 1: the query's own position
  EXPECT_EQ(lo, 5);
  EXPECT_EQ(hi, 6);
  AttnParams p;
  p.scale = 0.5f;
  EXPECT_FLOAT_EQ(attention_logit(3.0f, p), 1.5f);
  p.softcap = 2.0f;
  EXPECT_FLOAT_EQ(attention_logit(3.0f, p), 2.0f * std::tanh(0.75f));
}

}  // namespace
