// Log-det cost and hierarchical minimum-weight perfect matching (ratekv/tasq/grouping.h).
#include "ratekv/tasq/grouping.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include "ratekv/common/error.h"
#include "tasq/lemon_matching.h"

namespace ratekv::tasq {

double logdet_cost(const std::vector<double>& sigma, int d, const std::vector<int>& group) {
  check(!group.empty(), "logdet_cost: empty group");
  check(d > 0 && sigma.size() == static_cast<size_t>(d) * d, "logdet_cost: Σ has {} values, expected {}·{}",
        sigma.size(), d, d);
  const int n = static_cast<int>(group.size());
  Eigen::MatrixXd m(n, n);
  double tr = 0.0;
  for (int i = 0; i < n; ++i) {
    check(group[i] >= 0 && group[i] < d, "logdet_cost: channel {} outside 0..{}", group[i], d - 1);
    for (int j = 0; j < n; ++j) m(i, j) = sigma[static_cast<size_t>(group[i]) * d + group[j]];
    tr += m(i, i);
  }
  const double ridge = 1e-12 * (tr / n + 1e-30);
  for (int i = 0; i < n; ++i) m(i, i) += ridge;
  Eigen::LLT<Eigen::MatrixXd> llt(m);
  check(llt.info() == Eigen::Success, "logdet_cost: Σ[G,G] is not positive semi-definite (group of {} channels)", n);
  double ld = 0.0;
  for (int i = 0; i < n; ++i) ld += 2.0 * std::log(llt.matrixL()(i, i));
  return ld;
}

double partition_cost(const std::vector<double>& sigma, int d, const std::vector<std::vector<int>>& groups) {
  double c = 0.0;
  for (const auto& g : groups) c += logdet_cost(sigma, d, g);
  return c;
}

namespace {

std::vector<int> merged(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> u = a;
  u.insert(u.end(), b.begin(), b.end());
  return u;
}

}  // namespace

std::vector<std::vector<int>> match_level(const std::vector<double>& sigma, int d,
                                          const std::vector<std::vector<int>>& units) {
  const int n = static_cast<int>(units.size());
  check(n >= 2 && n % 2 == 0, "match_level: {} units; a perfect matching needs an even number ≥ 2", n);
  std::vector<double> self(n);
  for (int i = 0; i < n; ++i) self[i] = logdet_cost(sigma, d, units[i]);
  std::vector<long long> w(static_cast<size_t>(n) * n, 0);
  constexpr double kScale = 4294967296.0;  // 2^32 per nat
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      const double e = logdet_cost(sigma, d, merged(units[i], units[j])) - self[i] - self[j];
      check(std::isfinite(e) && std::abs(e) * kScale < 1e17, "match_level: edge weight {} out of range", e);
      w[static_cast<size_t>(i) * n + j] = std::llround(e * kScale);
    }
  const std::vector<int> mate = detail::lemon_min_weight_perfect_matching(n, w);
  check(static_cast<int>(mate.size()) == n, "match_level: no perfect matching over {} units", n);
  std::vector<std::vector<int>> out;
  std::vector<bool> used(n, false);
  for (int i = 0; i < n; ++i) {
    if (used[i]) continue;
    const int j = mate[i];
    check(j >= 0 && j < n && j != i && !used[j], "match_level: inconsistent matching");
    used[i] = used[j] = true;
    out.push_back(merged(units[i], units[j]));
  }
  return out;
}

std::vector<std::vector<int>> match_groups(const std::vector<double>& sigma, int d,
                                           const std::vector<std::array<int, 2>>& pairs, int g) {
  check(g >= 2 && (g & (g - 1)) == 0, "match_groups: group size {} must be 2·2^k (2, 4, 8, …)", g);
  check(static_cast<int>(pairs.size()) * 2 == d && d % g == 0, "match_groups: head_dim {} is not a multiple of {}", d,
        g);
  std::vector<std::vector<int>> units;
  for (const auto& p : pairs) units.push_back({p[0], p[1]});
  while (static_cast<int>(units[0].size()) < g) units = match_level(sigma, d, units);
  return units;
}

std::vector<std::vector<int>> contiguous_pair_groups(const std::vector<std::array<int, 2>>& pairs, int g) {
  check(g >= 2 && g % 2 == 0 && (pairs.size() * 2) % g == 0, "contiguous_pair_groups: group size {} does not divide {}",
        g, pairs.size() * 2);
  std::vector<std::vector<int>> out;
  for (size_t i = 0; i < pairs.size(); i += g / 2) {
    std::vector<int> grp;
    for (size_t k = i; k < i + g / 2; ++k) grp.insert(grp.end(), {pairs[k][0], pairs[k][1]});
    out.push_back(std::move(grp));
  }
  return out;
}

std::vector<std::vector<int>> contiguous_channel_groups(int d, int g) {
  check(g >= 1 && d % g == 0, "contiguous_channel_groups: group size {} does not divide head_dim {}", g, d);
  std::vector<std::vector<int>> out(d / g);
  for (int c = 0; c < d; ++c) out[c / g].push_back(c);
  return out;
}

std::vector<std::vector<int>> best_pairing_exhaustive(const std::vector<double>& sigma, int d,
                                                      const std::vector<std::vector<int>>& units) {
  const int n = static_cast<int>(units.size());
  check(n >= 2 && n % 2 == 0 && n <= 12, "best_pairing_exhaustive: {} units (even, ≤ 12)", n);
  std::vector<std::vector<double>> cost(n, std::vector<double>(n, 0.0));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) cost[i][j] = logdet_cost(sigma, d, merged(units[i], units[j]));
  std::vector<int> mate(n, -1), best;
  double best_cost = std::numeric_limits<double>::infinity();
  std::function<void(double)> rec = [&](double acc) {
    int i = 0;
    while (i < n && mate[i] >= 0) ++i;
    if (i == n) {
      if (acc < best_cost) {
        best_cost = acc;
        best = mate;
      }
      return;
    }
    for (int j = i + 1; j < n; ++j) {
      if (mate[j] >= 0) continue;
      mate[i] = j;
      mate[j] = i;
      rec(acc + cost[i][j]);
      mate[i] = mate[j] = -1;
    }
  };
  rec(0.0);
  std::vector<std::vector<int>> out;
  for (int i = 0; i < n; ++i)
    if (best[i] > i) out.push_back(merged(units[i], units[best[i]]));
  return out;
}

}  // namespace ratekv::tasq
