// The marginal-gain greedy against exhaustive search (alloc/greedy.h).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "ratekv/alloc/greedy.h"
#include "ratekv/common/error.h"

using namespace ratekv;
using namespace ratekv::alloc;

namespace {

// Minimum of Σ c_i(b_i) over every vector in the box with the budget rule; +inf if none.
double exhaustive(const std::vector<int>& lo, const std::vector<int>& hi, const CostFn& cost, int64_t budget,
                  BudgetMode mode) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> b = lo;
  std::function<void(size_t, int64_t, double)> rec = [&](size_t i, int64_t sum, double c) {
    if (i == lo.size()) {
      if (mode == BudgetMode::Exact ? sum == budget : sum <= budget) best = std::min(best, c);
      return;
    }
    for (int x = lo[i]; x <= hi[i]; ++x) rec(i + 1, sum + x, c + cost((int)i, x));
  };
  rec(0, 0, 0.0);
  return best;
}

// Random convex costs: integer non-increasing gains (so ties are exact), some
// zero or negative, some components flat.
struct Instance {
  std::vector<int> lo, hi;
  std::vector<std::vector<double>> table;  // table[i][b - lo]
  double cost(int i, int b) const { return table[i][b - lo[i]]; }
};

Instance random_instance(std::mt19937_64& rng) {
  Instance in;
  const int n = 1 + (int)(rng() % 5);
  for (int i = 0; i < n; ++i) {
    const int lo = (int)(rng() % 3), hi = lo + (int)(rng() % 4);
    in.lo.push_back(lo);
    in.hi.push_back(hi);
    std::vector<double> t = {(double)(rng() % 20)};
    int gain = (rng() % 4 == 0) ? 0 : (int)(rng() % 9) - 1;  // -1..7, or flat
    for (int b = lo; b < hi; ++b) {
      t.push_back(t.back() - gain);
      gain -= (int)(rng() % 3);  // non-increasing gains: convex
    }
    in.table.push_back(t);
  }
  return in;
}

}  // namespace

TEST(Greedy, MatchesExhaustiveSearchOnRandomInstances) {
  std::mt19937_64 rng(20261129);
  int checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const Instance in = random_instance(rng);
    int64_t smin = 0, smax = 0;
    for (size_t i = 0; i < in.lo.size(); ++i) {
      smin += in.lo[i];
      smax += in.hi[i];
    }
    const CostFn cost = [&](int i, int b) { return in.cost(i, b); };
    const BudgetMode mode = trial % 2 ? BudgetMode::Exact : BudgetMode::AtMost;
    const int64_t budget = smin + (int64_t)(rng() % (smax - smin + (mode == BudgetMode::AtMost ? 3 : 1)));
    const Allocation a = allocate_separable_convex(in.lo, in.hi, cost, budget, mode);
    const double ref = exhaustive(in.lo, in.hi, cost, budget, mode);
    ASSERT_DOUBLE_EQ(a.cost, ref) << "trial " << trial << " budget " << budget;
    int64_t sum = 0;
    double c = 0;
    for (size_t i = 0; i < a.bits.size(); ++i) {
      ASSERT_GE(a.bits[i], in.lo[i]);
      ASSERT_LE(a.bits[i], in.hi[i]);
      sum += a.bits[i];
      c += in.cost((int)i, a.bits[i]);
    }
    ASSERT_EQ(sum, a.total_bits);
    ASSERT_DOUBLE_EQ(c, a.cost);
    if (mode == BudgetMode::Exact) ASSERT_EQ(sum, budget);
    else ASSERT_LE(sum, budget);
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
}

TEST(Greedy, TiesGoToTheLowestIndex) {
  const std::vector<int> lo = {0, 0, 0}, hi = {3, 3, 3};
  const CostFn same = [](int, int b) { return std::ldexp(1.0, -2 * b); };
  EXPECT_EQ(allocate_separable_convex(lo, hi, same, 1, BudgetMode::Exact).bits, (std::vector<int>{1, 0, 0}));
  EXPECT_EQ(allocate_separable_convex(lo, hi, same, 2, BudgetMode::Exact).bits, (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(allocate_separable_convex(lo, hi, same, 4, BudgetMode::Exact).bits, (std::vector<int>{2, 1, 1}));
  // Component 2 has 4x the weight: one extra bit of it equals a bit elsewhere.
  const CostFn w = [](int i, int b) { return (i == 2 ? 4.0 : 1.0) * std::ldexp(1.0, -2 * b); };
  EXPECT_EQ(allocate_separable_convex(lo, hi, w, 1, BudgetMode::Exact).bits, (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(allocate_separable_convex(lo, hi, w, 2, BudgetMode::Exact).bits, (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(allocate_separable_convex(lo, hi, w, 3, BudgetMode::Exact).bits, (std::vector<int>{1, 1, 1}));
}

TEST(Greedy, BudgetExactlyAtTheBounds) {
  const std::vector<int> lo = {1, 0, 2}, hi = {3, 4, 2};
  const CostFn c = [](int i, int b) { return (i + 1.0) * std::ldexp(1.0, -b); };
  EXPECT_EQ(allocate_separable_convex(lo, hi, c, 3, BudgetMode::Exact).bits, lo);
  EXPECT_EQ(allocate_separable_convex(lo, hi, c, 9, BudgetMode::Exact).bits, hi);
  EXPECT_EQ(allocate_separable_convex(lo, hi, c, 50, BudgetMode::AtMost).bits, hi);  // AtMost may exceed Σ b_max
}

TEST(Greedy, AtMostSpendsOnlyUsefulBits) {
  // Component 0 has zero sensitivity (flat cost), component 1 saturates after 2 bits.
  const std::vector<int> lo = {0, 0}, hi = {5, 5};
  const CostFn c = [](int i, int b) { return i == 0 ? 7.0 : (double)std::max(0, 2 - b); };
  const Allocation a = allocate_separable_convex(lo, hi, c, 10, BudgetMode::AtMost);
  EXPECT_EQ(a.bits, (std::vector<int>{0, 2}));
  EXPECT_EQ(a.total_bits, 2);
  EXPECT_DOUBLE_EQ(a.cost, 7.0);
  // Exact mode must spend all 10 bits anyway.
  EXPECT_EQ(allocate_separable_convex(lo, hi, c, 10, BudgetMode::Exact).total_bits, 10);
}

TEST(Greedy, InfeasibleBudgetsNameTheNumbers) {
  const std::vector<int> lo = {1, 2}, hi = {3, 4};
  const CostFn c = [](int, int b) { return std::ldexp(1.0, -b); };
  try {
    allocate_separable_convex(lo, hi, c, 2, BudgetMode::Exact, "test");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "test: budget of 2 bits is below the minimum Σ b_min = 3 (Σ b_max = 7)");
  }
  try {
    allocate_separable_convex(lo, hi, c, 8, BudgetMode::Exact, "test");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "test: budget of 8 bits exceeds the maximum Σ b_max = 7 (Σ b_min = 3)");
  }
  EXPECT_THROW(allocate_separable_convex(lo, hi, c, 2, BudgetMode::AtMost), Error);
  EXPECT_NO_THROW(allocate_separable_convex(lo, hi, c, 8, BudgetMode::AtMost));
}

TEST(Greedy, RejectsNonConvexAndNonFiniteCostsAndBadBounds) {
  const std::vector<int> lo = {0, 0}, hi = {3, 3};
  // Gains 1 then 2: concave in the middle.
  const CostFn bad = [](int i, int b) { return i == 1 ? (b == 0 ? 10.0 : b == 1 ? 9.0 : b == 2 ? 7.0 : 6.5) : 1.0; };
  try {
    allocate_separable_convex(lo, hi, bad, 3, BudgetMode::Exact, "t");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t: component 1: cost is not convex in b at 1 bits"), std::string::npos)
        << e.what();
  }
  const CostFn nan = [](int, int b) { return b == 2 ? std::nan("") : 1.0; };
  EXPECT_THROW(allocate_separable_convex(lo, hi, nan, 3, BudgetMode::Exact), Error);
  EXPECT_THROW(allocate_separable_convex({2}, {1}, bad, 1, BudgetMode::Exact), Error);
  EXPECT_THROW(allocate_separable_convex({0, 0}, {1}, bad, 1, BudgetMode::Exact), Error);
  EXPECT_THROW(allocate_separable_convex({}, {}, bad, 0, BudgetMode::Exact), Error);
}
