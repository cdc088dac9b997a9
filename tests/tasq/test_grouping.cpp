// Covariance-aware grouping: log-det cost closed forms, hierarchical matching
// vs contiguous grouping on random SPD covariances, first level vs exhaustive
// search, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <cstdio>
#include <set>

#include "ratekv/common/error.h"
#include "ratekv/model/model.h"
#include "ratekv/tasq/grouping.h"

using namespace ratekv;
using namespace ratekv::tasq;

namespace {

// Σ = A Aᵀ / m + ε I with A (d × m) Gaussian whose columns load on random
// channel subsets (so channel pairs have uneven dependence).
std::vector<double> random_spd(int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_int_distribution<int> pick(0, d - 1);
  const int m = d / 2;
  std::vector<double> a(static_cast<size_t>(d) * m, 0.0);
  for (int j = 0; j < m; ++j) {
    for (int r = 0; r < 3; ++r) a[static_cast<size_t>(pick(rng)) * m + j] += 2.0 * nd(rng);
    for (int i = 0; i < d; ++i) a[static_cast<size_t>(i) * m + j] += 0.3 * nd(rng);
  }
  std::vector<double> s(static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i)
    for (int k = 0; k < d; ++k) {
      double acc = 0.0;
      for (int j = 0; j < m; ++j) acc += a[static_cast<size_t>(i) * m + j] * a[static_cast<size_t>(k) * m + j];
      s[static_cast<size_t>(i) * d + k] = acc / m + (i == k ? 0.05 : 0.0);
    }
  return s;
}

std::set<std::set<int>> as_sets(const std::vector<std::vector<int>>& g) {
  std::set<std::set<int>> out;
  for (const auto& x : g) out.insert(std::set<int>(x.begin(), x.end()));
  return out;
}

}  // namespace

TEST(Grouping, LogdetClosedForms) {
  // diag(2, 3, 5): log det of {0, 2} = log 10.
  std::vector<double> s{2, 0, 0, 0, 3, 0, 0, 0, 5};
  EXPECT_NEAR(logdet_cost(s, 3, {0, 2}), std::log(10.0), 1e-9);
  // [[4, 2], [2, 3]]: det 8.
  std::vector<double> t{4, 2, 2, 3};
  EXPECT_NEAR(logdet_cost(t, 2, {0, 1}), std::log(8.0), 1e-9);
  EXPECT_NEAR(logdet_cost(t, 2, {1, 0}), std::log(8.0), 1e-9);  // order does not matter
  // Fischer: merging never costs more than the parts.
  const auto r = random_spd(16, 4);
  EXPECT_LE(logdet_cost(r, 16, {0, 1, 2, 3}), logdet_cost(r, 16, {0, 1}) + logdet_cost(r, 16, {2, 3}) + 1e-9);
}

// One matching level is optimal over all pairings, so it never costs more
// than contiguous pairs (a feasible pairing). Deeper levels are greedy: the
// fit keeps the contiguous partition when the hierarchy loses (tasq/fit.h);
// here it loses on few of the random cases (counted, bounded).
TEST(Grouping, MatchedPartitionNeverCostsMoreThanContiguous) {
  int deeper = 0, deeper_worse = 0;
  for (RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::NeoX})
    for (int d : {16, 64})
      for (int g : {4, 8})
        for (uint32_t seed = 1; seed <= 12; ++seed) {
          const auto s = random_spd(d, seed * 31 + d + g);
          const auto pairs = rope_pairs(layout, d);
          const auto m = match_groups(s, d, pairs, g);
          ASSERT_EQ(static_cast<int>(m.size()), d / g);
          std::vector<int> seen(d, 0);
          for (const auto& grp : m) {
            ASSERT_EQ(static_cast<int>(grp.size()), g);
            for (int c : grp) seen[c]++;
            // RoPE pairs stay together.
            for (const auto& p : pairs) {
              const bool a = std::count(grp.begin(), grp.end(), p[0]) > 0;
              const bool b = std::count(grp.begin(), grp.end(), p[1]) > 0;
              ASSERT_EQ(a, b);
            }
          }
          for (int c = 0; c < d; ++c) ASSERT_EQ(seen[c], 1);
          const double cm = partition_cost(s, d, m);
          const double cp = partition_cost(s, d, contiguous_pair_groups(pairs, g));
          if (g == 4) {
            EXPECT_LE(cm, cp + 1e-9) << "d " << d << " g " << g << " seed " << seed;
          } else {
            ++deeper;
            deeper_worse += cm > cp + 1e-9;
          }
          if (layout == RopeLayout::Interleaved) {  // contiguous channels = contiguous pairs
            EXPECT_NEAR(partition_cost(s, d, contiguous_channel_groups(d, g)), cp, 1e-9);
          }
        }
  EXPECT_EQ(deeper, 48);
  EXPECT_LE(deeper_worse, 4) << "two-level matching lost to contiguous pairs on " << deeper_worse << " of 48";
  std::printf("two-level matching (g = 8) cost more than contiguous pairs on %d of %d random covariances\n",
              deeper_worse, deeper);
}

TEST(Grouping, FirstLevelEqualsExhaustiveBestPairing) {
  for (int n_pairs : {6, 8})
    for (uint32_t seed = 1; seed <= 10; ++seed) {
      const int d = 2 * n_pairs;
      const auto s = random_spd(d, 1000 + seed * 7 + n_pairs);
      std::vector<std::vector<int>> units;
      for (const auto& p : rope_pairs(RopeLayout::Interleaved, d)) units.push_back({p[0], p[1]});
      const auto lemon = match_level(s, d, units);
      const auto brute = best_pairing_exhaustive(s, d, units);
      EXPECT_NEAR(partition_cost(s, d, lemon), partition_cost(s, d, brute), 1e-6);
      EXPECT_EQ(as_sets(lemon), as_sets(brute)) << n_pairs << " pairs, seed " << seed;
    }
}

TEST(Grouping, BadInputIsError) {
  const auto s = random_spd(12, 3);
  std::vector<std::vector<int>> odd{{0, 1}, {2, 3}, {4, 5}};
  EXPECT_THROW(match_level(s, 12, odd), Error);
  EXPECT_THROW(match_groups(s, 12, rope_pairs(RopeLayout::Interleaved, 12), 6), Error);  // not 2·2^k
  EXPECT_THROW(match_groups(s, 12, rope_pairs(RopeLayout::Interleaved, 12), 8), Error);  // 8 ∤ 12
  EXPECT_THROW(logdet_cost(s, 12, {}), Error);
  EXPECT_THROW(logdet_cost(s, 12, {12}), Error);
  std::vector<double> neg{1, 0, 0, -1};
  EXPECT_THROW(logdet_cost(neg, 2, {0, 1}), Error);
  EXPECT_THROW(contiguous_channel_groups(12, 5), Error);
}
