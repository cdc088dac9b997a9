// ratekv/alloc/greedy.h — exact integer bit allocation for separable convex costs.
//
// Problem: given n components with integer bit widths b_i in [b_min_i, b_max_i]
// and costs c_i(b) (distortion at b bits), minimize Σ_i c_i(b_i) subject to
// Σ_i b_i = B (BudgetMode::Exact) or Σ_i b_i ≤ B (BudgetMode::AtMost).
// Every component's bit counts the same (one "unit"); callers scale their
// budgets (e.g. a RoPE block of 2 channels at b bits per channel is b units
// of 2 bits each). Unequal unit prices would make this a knapsack problem,
// which the greedy below does not solve exactly.
//
// Algorithm (marginal-gain greedy, Fox 1966): start at b = b_min and hand out
// the R = B − Σ b_min remaining units one at a time, each to the component
// with the largest marginal gain Δ_i(b_i) = c_i(b_i) − c_i(b_i + 1) among
// those below b_max. Ties: the lowest component index wins (deterministic).
// In AtMost mode a unit is only handed out when its gain is strictly > 0.
//
// Why it is integer-optimal when every c_i is convex in b: write
//   Σ_i c_i(b_i) = Σ_i c_i(b_min_i) − Σ_i Σ_{k=b_min_i}^{b_i−1} Δ_i(k).
// A feasible b is a choice of R "steps" (i, k) that is prefix-closed in k for
// each i. Convexity means Δ_i(k) is non-increasing in k, so for any R the R
// largest steps of the multiset {Δ_i(k)} can be taken prefix-closed (when two
// steps of one component tie, take the earlier one). Their sum bounds every
// feasible choice of R steps from above, hence minimizes the cost. Greedy
// takes exactly such a top-R set: at each moment the largest available step
// of component i is its next one Δ_i(b_i), and everything it has not taken is
// ≤ the steps it took. For AtMost, the optimum over all R' ≤ R takes only
// positive steps, and the greedy prefix stopping at the first gain ≤ 0 is it.
//
// Convexity is checked (relative tolerance 1e-12); a non-convex cost is
// reported as ratekv::Error rather than returning a possibly wrong answer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ratekv::alloc {

/// Σ b_i = B exactly, or Σ b_i ≤ B (spend only units that reduce the cost).
enum class BudgetMode { Exact, AtMost };

/// c_i(b): cost (distortion) of component i at b bits. Must be finite for
/// b in [b_min_i, b_max_i] and convex in b.
using CostFn = std::function<double(int i, int b)>;

/// Result of an allocation: the widths b_i, Σ c_i(b_i), and Σ b_i.
struct Allocation {
  std::vector<int> bits;
  double cost = 0.0;
  int64_t total_bits = 0;
};

/// Exact minimizer of Σ c_i(b_i) (see file comment). `b_min`, `b_max` have
/// one entry per component (n ≥ 1, 0 ≤ b_min_i ≤ b_max_i ≤ 64).
/// Throws ratekv::Error when the sizes differ, a bound is out of range, the
/// budget is infeasible (B < Σ b_min, or B > Σ b_max in Exact mode; the
/// message names B, Σ b_min and Σ b_max), or a cost is non-finite or not
/// convex (naming the component and width). `what` prefixes every message
/// (e.g. "ratequant").
Allocation allocate_separable_convex(const std::vector<int>& b_min, const std::vector<int>& b_max,
                                     const CostFn& cost, int64_t budget, BudgetMode mode,
                                     const std::string& what = "allocation");

}  // namespace ratekv::alloc
