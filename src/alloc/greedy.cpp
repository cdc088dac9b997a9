// Marginal-gain greedy for separable convex integer allocation (alloc/greedy.h).
#include "ratekv/alloc/greedy.h"

#include <cmath>
#include <queue>

#include "ratekv/common/error.h"

namespace ratekv::alloc {

Allocation allocate_separable_convex(const std::vector<int>& b_min, const std::vector<int>& b_max,
                                     const CostFn& cost, int64_t budget, BudgetMode mode,
                                     const std::string& what) {
  const size_t n = b_min.size();
  check(n >= 1, "{}: no components to allocate bits to", what);
  check(b_max.size() == n, "{}: b_min has {} entries but b_max has {}", what, n, b_max.size());
  int64_t sum_min = 0, sum_max = 0;
  for (size_t i = 0; i < n; ++i) {
    check(b_min[i] >= 0 && b_min[i] <= b_max[i] && b_max[i] <= 64,
          "{}: component {}: bounds b_min = {}, b_max = {}: expected 0 <= b_min <= b_max <= 64", what, i,
          b_min[i], b_max[i]);
    sum_min += b_min[i];
    sum_max += b_max[i];
  }
  check(budget >= sum_min, "{}: budget of {} bits is below the minimum Σ b_min = {} (Σ b_max = {})", what,
        budget, sum_min, sum_max);
  if (mode == BudgetMode::Exact) {
    check(budget <= sum_max, "{}: budget of {} bits exceeds the maximum Σ b_max = {} (Σ b_min = {})", what,
          budget, sum_max, sum_min);
  }

  // Tabulate every cost once and check finiteness and convexity.
  std::vector<std::vector<double>> table(n);
  for (size_t i = 0; i < n; ++i) {
    auto& t = table[i];
    for (int b = b_min[i]; b <= b_max[i]; ++b) {
      const double c = cost((int)i, b);
      check(std::isfinite(c), "{}: component {}: cost at {} bits is {} (expected a finite number)", what, i, b,
            c);
      t.push_back(c);
    }
    for (size_t k = 2; k < t.size(); ++k) {
      const double d_prev = t[k - 2] - t[k - 1], d_next = t[k - 1] - t[k];
      const double tol = 1e-12 * (std::abs(t[k - 2]) + std::abs(t[k - 1]) + std::abs(t[k]));
      check(d_next <= d_prev + tol,
            "{}: component {}: cost is not convex in b at {} bits (gain {} -> {} then {} -> {}); greedy would not "
            "be exact",
            what, i, b_min[i] + (int)k - 1, d_prev, b_min[i] + (int)k - 1, d_next, b_min[i] + (int)k);
    }
  }

  Allocation a;
  a.bits = b_min;
  struct Step {
    double gain;
    size_t i;
  };
  // Max-heap on gain; among equal gains the lowest index comes first.
  auto worse = [](const Step& x, const Step& y) { return x.gain < y.gain || (x.gain == y.gain && x.i > y.i); };
  std::priority_queue<Step, std::vector<Step>, decltype(worse)> heap(worse);
  auto gain_of = [&](size_t i) {
    const size_t k = (size_t)(a.bits[i] - b_min[i]);
    return table[i][k] - table[i][k + 1];
  };
  for (size_t i = 0; i < n; ++i)
    if (b_min[i] < b_max[i]) heap.push({gain_of(i), i});
  for (int64_t r = budget - sum_min; r > 0 && !heap.empty(); --r) {
    const Step s = heap.top();
    if (mode == BudgetMode::AtMost && !(s.gain > 0.0)) break;
    heap.pop();
    ++a.bits[s.i];
    if (a.bits[s.i] < b_max[s.i]) heap.push({gain_of(s.i), s.i});
  }
  for (size_t i = 0; i < n; ++i) {
    a.cost += table[i][(size_t)(a.bits[i] - b_min[i])];
    a.total_bits += a.bits[i];
  }
  return a;
}

}  // namespace ratekv::alloc
