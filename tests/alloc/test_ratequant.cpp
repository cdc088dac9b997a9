// RateQuant: integer optimum vs brute force, relaxation vs closed form (alloc/ratequant.h).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "ratekv/alloc/ratequant.h"
#include "ratekv/common/error.h"

using namespace ratekv;
using namespace ratekv::alloc;

namespace {

double brute_force(const RateQuantProblem& p) {
  const size_t m = p.weight.size();
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> b(m);
  std::function<void(size_t, int64_t)> rec = [&](size_t i, int64_t sum) {
    if (i == m) {
      if (sum == p.total_bits) best = std::min(best, ratequant_distortion(p, b));
      return;
    }
    for (int x = p.b_min[i]; x <= p.b_max[i]; ++x) {
      b[i] = x;
      rec(i + 1, sum + x);
    }
  };
  rec(0, 0);
  return best;
}

RateQuantProblem common_beta(std::vector<double> a, double beta, int lo, int hi, int64_t total) {
  RateQuantProblem p;
  p.weight = a;
  p.alpha.assign(a.size(), 1.0);
  p.beta.assign(a.size(), beta);
  p.b_min.assign(a.size(), lo);
  p.b_max.assign(a.size(), hi);
  p.total_bits = total;
  return p;
}

}  // namespace

TEST(RateQuant, IntegerAllocationMatchesBruteForce) {
  std::mt19937_64 rng(4242);
  const double betas[] = {2.0, 3.5, 3.6, 4.0};
  for (int trial = 0; trial < 1500; ++trial) {
    const int m = 2 * (1 + (int)(rng() % 3));  // K,V of 1..3 heads
    RateQuantProblem p;
    const double bk = betas[rng() % 4], bv = betas[rng() % 4];
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < m; ++i) {
      p.weight.push_back(rng() % 6 == 0 ? 0.0 : (double)(rng() % 50) / 10.0);
      p.alpha.push_back(rng() % 8 == 0 ? 0.0 : (double)(1 + rng() % 9) / 3.0);
      p.beta.push_back(i % 2 == 0 ? bk : bv);
      const int a = 1 + (int)(rng() % 3);
      p.b_min.push_back(a);
      p.b_max.push_back(a + (int)(rng() % 4));
      lo += p.b_min.back();
      hi += p.b_max.back();
    }
    p.total_bits = lo + (int64_t)(rng() % (hi - lo + 1));
    const RateQuantResult r = allocate_ratequant(p);
    const double ref = brute_force(p);
    ASSERT_NEAR(r.distortion, ref, 1e-12 * (1 + ref)) << "trial " << trial;
    int64_t sum = 0;
    for (int b : r.bits) sum += b;
    ASSERT_EQ(sum, p.total_bits);
    // The relaxation is a lower bound on the integer optimum and spends B.
    double rs = 0;
    for (double b : r.relaxed.bits) rs += b;
    ASSERT_NEAR(rs, (double)p.total_bits, 1e-6);
    ASSERT_LE(r.relaxed.distortion, r.distortion * (1 + 1e-9) + 1e-15);
  }
}

// Priced allocation (stored bits, non-linear prices) against exhaustive
// search: prices of TQ-MSE codecs at head_dim 16 (16·b + 16, + 16 more above
// 4 bits: the extension norm), KIVI-like affine prices, and random
// non-decreasing ones.
TEST(RateQuant, PricedAllocationMatchesBruteForce) {
  std::mt19937_64 rng(21);
  int compared = 0, infeasible = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const size_t m = 2 + rng() % 5;
    RateQuantProblem p;
    std::vector<std::vector<int64_t>> price(m);
    for (size_t i = 0; i < m; ++i) {
      p.weight.push_back(rng() % 6 == 0 ? 0.0 : std::exp((double)(rng() % 3000) / 1000.0));
      p.alpha.push_back(0.5 + (double)(rng() % 100) / 50.0);
      p.beta.push_back(i % 2 ? 3.6 : 2.5 + (double)(rng() % 10) / 10.0);
      p.b_min.push_back(1 + (int)(rng() % 2));
      p.b_max.push_back(p.b_min.back() + 2 + (int)(rng() % 4));
      for (int b = p.b_min[i]; b <= p.b_max[i]; ++b) {
        int64_t c = 0;
        switch (trial % 3) {
          case 0: c = 16 * b + 16 + (b > 4 ? 16 : 0); break;  // TQ-MSE, head_dim 16
          case 1: c = 32 * b + 64; break;                      // affine (KIVI-like)
          default: c = (price[i].empty() ? 0 : price[i].back()) + 8 * (1 + (int64_t)(rng() % 4)); break;
        }
        price[i].push_back(c);
      }
    }
    int64_t lo = 0, hi = 0;
    for (size_t i = 0; i < m; ++i) {
      lo += price[i].front();
      hi += price[i].back();
    }
    for (int64_t budget = lo - 8; budget <= hi + 8; budget += 1 + (int64_t)(rng() % 23)) {
      // Exhaustive: min distortion (then min price) over all width vectors within the budget.
      double best = std::numeric_limits<double>::infinity();
      std::vector<int> b(m);
      std::function<void(size_t, int64_t)> rec = [&](size_t i, int64_t cost) {
        if (cost > budget) return;
        if (i == m) {
          best = std::min(best, ratequant_distortion(p, b));
          return;
        }
        for (int x = p.b_min[i]; x <= p.b_max[i]; ++x) {
          b[i] = x;
          rec(i + 1, cost + price[i][(size_t)(x - p.b_min[i])]);
        }
      };
      rec(0, 0);
      if (!std::isfinite(best)) {
        EXPECT_THROW(allocate_ratequant_priced(p, price, budget), Error);
        ++infeasible;
        continue;
      }
      const RateQuantResult r = allocate_ratequant_priced(p, price, budget);
      ASSERT_NEAR(r.distortion, best, 1e-12 * (1 + best)) << "trial " << trial << " budget " << budget;
      int64_t cost = 0;
      for (size_t i = 0; i < m; ++i) {
        ASSERT_GE(r.bits[i], p.b_min[i]);
        ASSERT_LE(r.bits[i], p.b_max[i]);
        cost += price[i][(size_t)(r.bits[i] - p.b_min[i])];
      }
      ASSERT_LE(cost, budget);
      ++compared;
    }
  }
  EXPECT_GT(compared, 300);
  EXPECT_GT(infeasible, 20);
  // With equal unit prices it is the code-bit problem: same answer as the greedy.
  const RateQuantProblem q = common_beta({5, 1, 0.2, 9}, 3.5, 1, 6, 14);
  std::vector<std::vector<int64_t>> unit(4);
  for (auto& row : unit)
    for (int b = 1; b <= 6; ++b) row.push_back(b);
  EXPECT_EQ(allocate_ratequant_priced(q, unit, 14).bits, allocate_ratequant(q).bits);
  // Bad prices.
  unit[2][3] = unit[2][2] - 1;
  EXPECT_THROW(allocate_ratequant_priced(q, unit, 14), Error);
  unit.pop_back();
  EXPECT_THROW(allocate_ratequant_priced(q, unit, 14), Error);
}

TEST(RateQuant, ClosedFormEqualsIntegerAnswerWhenIntegral) {
  // a = 4^{1, -1, 0, 0}, β = 4, b̄ = 3: b = 3 + log_4 a − mean log_4 a = {4, 2, 3, 3}.
  const RateQuantProblem p = common_beta({4.0, 0.25, 1.0, 1.0}, 4.0, 1, 8, 12);
  const RateQuantResult r = allocate_ratequant(p);
  EXPECT_EQ(r.bits, (std::vector<int>{4, 2, 3, 3}));
  ASSERT_EQ(r.relaxed.bits.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(r.relaxed.bits[i], (double)r.bits[i], 1e-12) << i;
  EXPECT_EQ(r.relaxed.n_clipped, 0);
  EXPECT_DOUBLE_EQ(r.distortion, 4.0 / 256.0 + 0.25 / 16.0 + 2.0 / 64.0);
  EXPECT_NEAR(r.relaxed.distortion, r.distortion, 1e-15);
  // AM/GM = (6.25/4)/1 and it is exactly the relaxation's gain over uniform b̄.
  EXPECT_DOUBLE_EQ(r.am_gm, 1.5625);
  EXPECT_NEAR(r.uniform_distortion / r.relaxed.distortion, r.am_gm, 1e-12);
  // Reverse water-filling formula, written out.
  const double mean_ln = (std::log(4.0) + std::log(0.25) + 0 + 0) / 4;
  const double a[] = {4.0, 0.25, 1.0, 1.0};
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(r.relaxed.bits[i], 3.0 + (std::log(a[i]) - mean_ln) / std::log(4.0), 1e-12);
}

TEST(RateQuant, RelaxationWithClippingSatisfiesKkt) {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    const int m = 2 + (int)(rng() % 10);
    RateQuantProblem p;
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < m; ++i) {
      p.weight.push_back(std::exp((double)(rng() % 1000) / 100.0 - 5.0));
      p.alpha.push_back(1.0);
      p.beta.push_back(i % 2 ? 3.5 : 2.5);
      p.b_min.push_back(1);
      p.b_max.push_back(2 + (int)(rng() % 6));
      lo += p.b_min.back();
      hi += p.b_max.back();
    }
    p.total_bits = lo + (int64_t)(rng() % (hi - lo + 1));
    const RateQuantRelaxation r = ratequant_relaxation(p);
    // Marginal value a lnβ β^-b equals λ for free components, ≤ λ at b_min, ≥ λ at b_max.
    const double lambda = std::exp(r.log_lambda);
    double sum = 0;
    for (int i = 0; i < m; ++i) {
      const double b = r.bits[i];
      sum += b;
      ASSERT_GE(b, p.b_min[i] - 1e-9);
      ASSERT_LE(b, p.b_max[i] + 1e-9);
      const double g = p.weight[i] * std::log(p.beta[i]) * std::pow(p.beta[i], -b);
      if (b > p.b_min[i] + 1e-7 && b < p.b_max[i] - 1e-7) ASSERT_NEAR(g / lambda, 1.0, 1e-6) << trial << " " << i;
      else if (b <= p.b_min[i] + 1e-7) ASSERT_LE(g / lambda, 1.0 + 1e-6);
      else ASSERT_GE(g / lambda, 1.0 - 1e-6);
    }
    ASSERT_NEAR(sum, (double)p.total_bits, 1e-6);
  }
}

TEST(RateQuant, ZeroSensitivityGetsTheMinimum) {
  const RateQuantProblem p = common_beta({0.0, 1.0, 2.0, 0.0}, 3.5, 2, 6, 14);
  const RateQuantResult r = allocate_ratequant(p);
  EXPECT_EQ(r.bits[0], 2);
  EXPECT_EQ(r.bits[3], 2);
  EXPECT_EQ(r.bits[1] + r.bits[2], 10);
  EXPECT_DOUBLE_EQ(r.relaxed.bits[0], 2.0);
  EXPECT_DOUBLE_EQ(r.relaxed.bits[3], 2.0);
}

TEST(RateQuant, UniformSplit) {
  // Keys 10x more costly: K3V2 beats K2V3 at 2.5.
  const auto cost = [](int k, int v) { return 10.0 * std::pow(4.0, -k) + std::pow(4.0, -v); };
  UniformSplit s = best_uniform_split(2.5, cost);
  EXPECT_EQ(s.k_bits, 3);
  EXPECT_EQ(s.v_bits, 2);
  EXPECT_DOUBLE_EQ(s.cost, 10.0 / 64 + 1.0 / 16);
  const auto vcost = [](int k, int v) { return std::pow(4.0, -k) + 10.0 * std::pow(4.0, -v); };
  s = best_uniform_split(3.5, vcost);
  EXPECT_EQ(s.k_bits, 3);
  EXPECT_EQ(s.v_bits, 4);
  const auto tie = [](int k, int v) { return std::pow(4.0, -k) + std::pow(4.0, -v); };
  s = best_uniform_split(2.5, tie);
  EXPECT_EQ(s.k_bits, 3);  // tie -> K⌈b⌉V⌊b⌋
  EXPECT_EQ(s.v_bits, 2);
  s = best_uniform_split(4.0, tie);
  EXPECT_EQ(s.k_bits, 4);
  EXPECT_EQ(s.v_bits, 4);
  EXPECT_THROW(best_uniform_split(-1.0, tie), Error);
}

TEST(RateQuant, BadInputsAreErrors) {
  RateQuantProblem p = common_beta({1.0, 2.0}, 3.5, 1, 4, 5);
  EXPECT_NO_THROW(allocate_ratequant(p));
  p.total_bits = 9;
  try {
    allocate_ratequant(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "ratequant: budget Σ b = 9 bits (4.5 per component) is outside [Σ b_min, Σ b_max] = [2, 8]");
  }
  p.total_bits = 1;
  EXPECT_THROW(allocate_ratequant(p), Error);
  p.total_bits = 5;
  p.beta[1] = 1.0;
  EXPECT_THROW(allocate_ratequant(p), Error);
  p.beta[1] = 3.5;
  p.weight[0] = -1;
  EXPECT_THROW(allocate_ratequant(p), Error);
  p.weight[0] = 1;
  p.alpha.pop_back();
  EXPECT_THROW(allocate_ratequant(p), Error);
}
