// The sampling definition's host reference (ratekv/engine/sampling.h)
// against closed forms: the distribution it draws from (temperature,
// top-k, top-p) computed directly from the logits in double, checked by
// exact inversion (each token's interval of u) and by frequencies over
// 20000 seeded draws; greedy = argmax with NaN and ties. Host only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "ratekv/common/error.h"
#include "ratekv/engine/sampling.h"

namespace {

using namespace ratekv;
using namespace ratekv::engine;

// The distribution of the definition, in double, by sorting.
std::vector<double> distribution(const std::vector<float>& x, const SamplingParams& sp) {
  const int V = static_cast<int>(x.size());
  std::vector<int> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return x[a] > x[b]; });
  const int k = sp.top_k > 0 ? std::min(sp.top_k, V) : V;
  std::vector<double> w(V, 0.0);
  double W = 0;
  for (int r = 0; r < k; ++r) W += (w[idx[r]] = std::exp((double(x[idx[r]]) - x[idx[0]]) / sp.temperature));
  int keep = k;
  if (sp.top_p < 1.f) {
    double c = 0;
    for (int r = 0; r < k; ++r)
      if ((c += w[idx[r]]) >= sp.top_p * W) {
        keep = r + 1;
        break;
      }
  }
  std::vector<double> p(V, 0.0);
  double S = 0;
  for (int r = 0; r < keep; ++r) S += w[idx[r]];
  for (int r = 0; r < keep; ++r) p[idx[r]] = w[idx[r]] / S;
  return p;
}

TEST(Sampling, GreedyIsArgmaxSkippingNaN) {
  std::vector<float> x = {1.f, 3.f, NAN, 3.f, -2.f};
  EXPECT_EQ(sample_reference(x.data(), 5, SamplingParams{}, 0.7), 1);
  x[1] = NAN;
  EXPECT_EQ(sample_reference(x.data(), 5, SamplingParams{}, 0.7), 3);
}

TEST(Sampling, DrawsFromTheDefinedDistribution) {
  std::mt19937 g(3);
  std::normal_distribution<float> N(0.f, 2.f);
  std::vector<float> x(40);  // distinct values, no ties
  for (auto& v : x) v = N(g);
  struct P {
    float t;
    int k;
    float p;
  };
  for (const P c : {P{1.f, 0, 1.f}, P{0.5f, 0, 1.f}, P{1.5f, 5, 1.f}, P{1.f, 0, 0.6f}, P{0.8f, 10, 0.5f}, P{2.f, 1, 1.f}}) {
    SamplingParams sp;
    sp.temperature = c.t;
    sp.top_k = c.k;
    sp.top_p = c.p;
    const auto p = distribution(x, sp);
    // Exact: u in the token's cumulative interval (index order) picks it.
    double cum = 0;
    for (int i = 0; i < 40; ++i) {
      if (p[i] == 0) continue;
      const double mid = cum + p[i] / 2;
      EXPECT_EQ(sample_reference(x.data(), 40, sp, mid), i) << "t " << c.t << " k " << c.k << " p " << c.p;
      cum += p[i];
    }
    // Frequencies over seeded draws (the uniforms of sampling_uniform).
    std::vector<int> hits(40, 0);
    const int n = 20000;
    for (int s = 0; s < n; ++s) ++hits[sample_reference(x.data(), 40, sp, sampling_uniform(99, s))];
    for (int i = 0; i < 40; ++i) {
      if (p[i] == 0) {
        EXPECT_EQ(hits[i], 0) << i;
        continue;
      }
      const double sd = std::sqrt(n * p[i] * (1 - p[i]));
      EXPECT_NEAR(hits[i], n * p[i], 5 * sd + 1) << "token " << i << " t " << c.t << " k " << c.k << " p " << c.p;
    }
  }
}

TEST(Sampling, UniformsAreInRangeAndSeeded) {
  double sum = 0;
  for (int s = 0; s < 10000; ++s) {
    const double u = sampling_uniform(5, s);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
  EXPECT_EQ(sampling_uniform(5, 3), sampling_uniform(5, 3));
  EXPECT_NE(sampling_uniform(5, 3), sampling_uniform(6, 3));
  SamplingParams bad;
  bad.temperature = -1.f;
  EXPECT_THROW(bad.validate(), Error);
  bad = SamplingParams{};
  bad.top_k = -2;
  EXPECT_THROW(bad.validate(), Error);
}

}  // namespace
