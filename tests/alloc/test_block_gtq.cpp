// Block-GTQ with group-norm charging against brute force (alloc/block_gtq.h).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include "ratekv/alloc/block_gtq.h"
#include "ratekv/alloc/greedy.h"
#include "ratekv/common/error.h"

using namespace ratekv;
using namespace ratekv::alloc;

namespace {

// Exhaustive minimum of J over all width vectors in {0,b_min..b_max}^L whose
// effective bits 2Σb + norm·|distinct b>0| fit the budget; +inf if none.
double brute_force(const std::vector<double>& s, int64_t budget, const BlockGtqOptions& o) {
  const int L = (int)s.size();
  std::vector<int> widths;
  if (o.b_min == 0) widths.push_back(0);
  for (int w = std::max(1, o.b_min); w <= o.b_max; ++w) widths.push_back(w);
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> b(L);
  std::function<void(int)> rec = [&](int i) {
    if (i == L) {
      std::set<int> used;
      int64_t bits = 0;
      for (int x : b) {
        bits += 2 * x;
        if (x > 0) used.insert(x);
      }
      bits += (int64_t)o.norm_bits * used.size();
      if (bits <= budget) best = std::min(best, block_distortion(s, b));
      return;
    }
    for (int w : widths) {
      b[i] = w;
      rec(i + 1);
    }
  };
  rec(0);
  return best;
}

}  // namespace

TEST(BlockGtq, MatchesBruteForceWithNormCharging) {
  std::mt19937_64 rng(7);
  const double pool[] = {0.0, 1.0, 1.0, 2.0, 4.0, 16.0, 0.37, 5.5};  // zeros and ties on purpose
  int compared = 0, infeasible = 0;
  for (int d : {2, 4, 6, 8, 10}) {
    for (int trial = 0; trial < (d == 10 ? 15 : 60); ++trial) {
      std::vector<double> s(d / 2);
      for (auto& x : s) x = pool[rng() % 8] * (trial % 3 == 0 ? 1.0 : 0.5 + (double)(rng() % 1000) / 1000.0);
      BlockGtqOptions o;
      o.b_min = trial % 4 == 3 ? 1 : 0;
      o.b_max = 4;
      o.norm_bits = trial % 5 == 4 ? 0 : 16;
      const int64_t max_bits = (int64_t)o.b_max * d + o.norm_bits;
      for (int64_t budget = 0; budget <= max_bits; budget += 1 + (int64_t)(rng() % 3)) {
        const double ref = brute_force(s, budget, o);
        if (!std::isfinite(ref)) {
          EXPECT_THROW(allocate_block_gtq(s, budget, o), Error) << "d " << d << " budget " << budget;
          ++infeasible;
          continue;
        }
        const BlockAllocation a = allocate_block_gtq(s, budget, o);
        ASSERT_NEAR(a.distortion, ref, 1e-12 * (1 + ref)) << "d " << d << " budget " << budget << " trial " << trial;
        ASSERT_LE(a.code_bits + a.norm_bits, budget);
        // The reported accounting matches the widths.
        std::set<int> used;
        int64_t code = 0;
        for (int x : a.bits) {
          ASSERT_TRUE(x == 0 ? o.b_min == 0 : (x >= o.b_min && x <= o.b_max));
          code += 2 * x;
          if (x > 0) used.insert(x);
        }
        ASSERT_EQ(a.code_bits, code);
        ASSERT_EQ(a.norm_bits, (int64_t)o.norm_bits * (int64_t)used.size());
        size_t listed = 0;
        for (const auto& g : a.groups) {
          for (int blk : g.blocks) ASSERT_EQ(a.bits[blk], g.bits);
          listed += g.blocks.size();
        }
        ASSERT_EQ(listed, s.size());
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(infeasible, 10);
}

TEST(BlockGtq, WithoutNormsEqualsTheSeparableGreedy) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 1 + (int)(rng() % 12);
    std::vector<double> s(L);
    for (auto& x : s) x = (rng() % 5 == 0) ? 0.0 : (double)(rng() % 100) / 7.0;
    const BlockGtqOptions o{0, 5, 0};
    const int64_t budget = (int64_t)(rng() % (2 * 5 * L + 1));
    const BlockAllocation a = allocate_block_gtq(s, budget, o);
    const Allocation g = allocate_separable_convex(
        std::vector<int>(L, 0), std::vector<int>(L, 5), [&](int i, int b) { return s[i] * std::ldexp(1.0, -2 * b); },
        budget / 2, BudgetMode::AtMost);
    ASSERT_NEAR(a.distortion, g.cost, 1e-12 * (1 + g.cost)) << trial;
  }
}

TEST(BlockGtq, HandExample) {
  // d = 4, s = {64, 1}, 24 bits: {4, 0} costs 8 + 16 bits, J = 64/256 + 1 = 1.25;
  // {3, 1} would need two norms (6 + 2 + 32 = 40 bits).
  const std::vector<double> s = {64.0, 1.0};
  const BlockAllocation a = allocate_block_gtq(s, 24);
  EXPECT_EQ(a.bits, (std::vector<int>{4, 0}));
  EXPECT_DOUBLE_EQ(a.distortion, 1.25);
  EXPECT_EQ(a.code_bits, 8);
  EXPECT_EQ(a.norm_bits, 16);
  EXPECT_DOUBLE_EQ(a.effective_bits_per_element(), 6.0);
  ASSERT_EQ(a.groups.size(), 2u);
  EXPECT_EQ(a.groups[0].bits, 4);
  EXPECT_EQ(a.groups[0].blocks, (std::vector<int>{0}));
  EXPECT_EQ(a.groups[1].bits, 0);
  EXPECT_EQ(a.groups[1].blocks, (std::vector<int>{1}));
  // 32 bits: {3, 1} would need 8 + 32 = 40 bits, but one norm over both
  // blocks at 4 bits costs 16 + 16 = 32 bits with J = (64 + 1)/256.
  const BlockAllocation b = allocate_block_gtq(s, 32);
  EXPECT_EQ(b.bits, (std::vector<int>{4, 4}));
  EXPECT_DOUBLE_EQ(b.distortion, 65.0 / 256.0);
  EXPECT_EQ(b.groups.size(), 1u);
  // 31 bits: {4, 4} no longer fits; {3, 3} (12 + 16) gives J = 1 + 1/64.
  EXPECT_EQ(allocate_block_gtq(s, 31).bits, (std::vector<int>{3, 3}));
}

TEST(BlockGtq, EqualEnergiesTieToLowerIndexFirst) {
  // No norm charge: 10 bits = 5 units over four equal blocks; the extra unit
  // goes to block 0.
  const std::vector<double> s = {1, 1, 1, 1};
  EXPECT_EQ(allocate_block_gtq(s, 10, {0, 4, 0}).bits, (std::vector<int>{2, 1, 1, 1}));
  EXPECT_EQ(allocate_block_gtq(s, 14, {0, 4, 0}).bits, (std::vector<int>{2, 2, 2, 1}));
  // With a 16-bit norm one shared width wins: 26 bits -> all at 1 (8 + 16).
  EXPECT_EQ(allocate_block_gtq(s, 26).bits, (std::vector<int>{1, 1, 1, 1}));
  // Unequal: s = {9, 1, 1, 0}; 0-energy blocks are dropped rather than paid for.
  const std::vector<double> t = {9, 1, 1, 0};
  const BlockAllocation a = allocate_block_gtq(t, 32);
  EXPECT_EQ(a.bits[3], 0);
}

TEST(BlockGtq, UniformAndBudgetConversion) {
  EXPECT_EQ(budget_bits_for(3.25, 64), 208);
  EXPECT_EQ(budget_bits_for(2.25, 64), 144);
  EXPECT_EQ(budget_bits_for(0.1 * 3, 10), 3);  // 0.30000000000000004 × 10
  EXPECT_THROW(budget_bits_for(-1, 64), Error);
  EXPECT_THROW(budget_bits_for(std::nan(""), 64), Error);
  std::vector<double> s(32, 1.0);
  s[0] = 8.0;
  const BlockAllocation u = allocate_block_uniform(s, 208);
  EXPECT_EQ(u.bits, std::vector<int>(32, 3));
  EXPECT_DOUBLE_EQ(u.effective_bits_per_element(), 3.25);
  EXPECT_DOUBLE_EQ(u.distortion, 39.0 / 64.0);
  EXPECT_EQ(allocate_block_uniform(s, 207).bits, std::vector<int>(32, 2));
  // At the same budget Block-GTQ is never worse than uniform.
  EXPECT_LE(allocate_block_gtq(s, 208).distortion, u.distortion);
}

TEST(BlockGtq, InfeasibleBudgetsAreErrorsWithNumbers) {
  const std::vector<double> s = {1, 2, 3, 4};  // d = 8
  try {
    allocate_block_gtq(s, 23, {1, 4, 16});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("budget of 23 bits per head (2.875 bits/element at head_dim 8) is below "
                                         "the minimum 24 bits"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(allocate_block_gtq(s, 24, {1, 4, 16}));
  try {
    allocate_block_gtq(s, 49, {0, 4, 16});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the most b_max = 4 can use: 48 bits"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(allocate_block_gtq(s, 48, {0, 4, 16}).bits, (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(allocate_block_gtq(s, 0, {0, 4, 16}).bits, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_THROW(allocate_block_gtq(s, 30, {3, 2, 16}), Error);
  EXPECT_THROW(allocate_block_gtq(s, 30, {0, 9, 16}), Error);
  EXPECT_THROW(allocate_block_gtq(s, 30, {0, 4, 15}), Error);
  EXPECT_THROW(allocate_block_gtq(std::vector<double>{1, -1}, 30), Error);
  EXPECT_THROW(allocate_block_gtq(std::vector<double>{1, std::nan("")}, 30), Error);
  EXPECT_THROW(allocate_block_gtq(std::vector<double>{}, 30), Error);
  EXPECT_THROW(allocate_block_uniform(s, 23, {1, 4, 16}), Error);
  EXPECT_THROW(allocate_block_uniform(s, 49, {0, 4, 16}), Error);
}
