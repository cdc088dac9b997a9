// RateQuant allocation: exact integer greedy + continuous relaxation (alloc/ratequant.h).
#include "ratekv/alloc/ratequant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ratekv/alloc/greedy.h"
#include "ratekv/common/error.h"

namespace ratekv::alloc {

namespace {

void check_problem(const RateQuantProblem& p) {
  const size_t m = p.weight.size();
  check(m >= 1, "ratequant: no components");
  check(p.alpha.size() == m && p.beta.size() == m && p.b_min.size() == m && p.b_max.size() == m,
        "ratequant: sizes differ: {} weights, {} alphas, {} betas, {} b_min, {} b_max", m, p.alpha.size(),
        p.beta.size(), p.b_min.size(), p.b_max.size());
  int64_t lo = 0, hi = 0;
  for (size_t i = 0; i < m; ++i) {
    check(std::isfinite(p.weight[i]) && p.weight[i] >= 0.0,
          "ratequant: component {}: sensitivity w = {}: expected finite and >= 0", i, p.weight[i]);
    check(std::isfinite(p.alpha[i]) && p.alpha[i] >= 0.0,
          "ratequant: component {}: alpha = {}: expected finite and >= 0", i, p.alpha[i]);
    check(std::isfinite(p.beta[i]) && p.beta[i] > 1.0, "ratequant: component {}: beta = {}: expected finite and > 1",
          i, p.beta[i]);
    check(p.b_min[i] >= 0 && p.b_min[i] <= p.b_max[i] && p.b_max[i] <= 16,
          "ratequant: component {}: bounds b_min = {}, b_max = {}: expected 0 <= b_min <= b_max <= 16", i,
          p.b_min[i], p.b_max[i]);
    lo += p.b_min[i];
    hi += p.b_max[i];
  }
  check(p.total_bits >= lo && p.total_bits <= hi,
        "ratequant: budget Σ b = {} bits ({:.4g} per component) is outside [Σ b_min, Σ b_max] = [{}, {}]",
        p.total_bits, (double)p.total_bits / m, lo, hi);
}

}  // namespace

double ratequant_distortion(const RateQuantProblem& p, std::span<const int> bits) {
  check(bits.size() == p.weight.size(), "ratequant: {} widths for {} components", bits.size(), p.weight.size());
  double d = 0.0;
  for (size_t i = 0; i < bits.size(); ++i) d += p.weight[i] * p.alpha[i] * std::pow(p.beta[i], -(double)bits[i]);
  return d;
}

double am_gm_ratio(std::span<const double> a) {
  double sum = 0.0, log_sum = 0.0;
  size_t n = 0;
  for (double x : a)
    if (x > 0.0) {
      sum += x;
      log_sum += std::log(x);
      ++n;
    }
  if (n < 2) return 1.0;
  return (sum / n) / std::exp(log_sum / n);
}

RateQuantRelaxation ratequant_relaxation(const RateQuantProblem& p) {
  check_problem(p);
  const size_t m = p.weight.size();
  std::vector<double> c(m), lb(m);  // c_i = ln(a_i ln β_i) (−inf when a_i = 0), lb_i = ln β_i
  for (size_t i = 0; i < m; ++i) {
    lb[i] = std::log(p.beta[i]);
    const double a = p.weight[i] * p.alpha[i];
    c[i] = a > 0.0 ? std::log(a * lb[i]) : -std::numeric_limits<double>::infinity();
  }
  auto bits_at = [&](double mu, size_t i) {
    return std::clamp((c[i] - mu) / lb[i], (double)p.b_min[i], (double)p.b_max[i]);
  };
  auto total_at = [&](double mu) {
    double t = 0.0;
    for (size_t i = 0; i < m; ++i) t += bits_at(mu, i);
    return t;
  };
  // Bracket μ: at mu_lo every positive component is at b_max, at mu_hi at b_min.
  double mu_lo = std::numeric_limits<double>::infinity(), mu_hi = -mu_lo;
  for (size_t i = 0; i < m; ++i)
    if (std::isfinite(c[i])) {
      mu_lo = std::min(mu_lo, c[i] - p.b_max[i] * lb[i]);
      mu_hi = std::max(mu_hi, c[i] - p.b_min[i] * lb[i]);
    }
  RateQuantRelaxation r;
  const double B = (double)p.total_bits;
  if (!std::isfinite(mu_lo)) {
    // Every a_i = 0: the objective is flat; spread the budget proportionally to the ranges.
    r.bits.assign(m, 0.0);
    double lo = 0, span = 0;
    for (size_t i = 0; i < m; ++i) {
      lo += p.b_min[i];
      span += p.b_max[i] - p.b_min[i];
    }
    const double f = span > 0 ? (B - lo) / span : 0.0;
    for (size_t i = 0; i < m; ++i) r.bits[i] = p.b_min[i] + f * (p.b_max[i] - p.b_min[i]);
    r.distortion = 0.0;
    return r;
  }
  mu_lo -= 1.0;
  mu_hi += 1.0;
  if (total_at(mu_lo) < B) {
    // Even with every a_i > 0 at b_max the budget is not spent: the rest goes
    // to the a_i = 0 components, where any width is optimal (zero distortion);
    // spread it proportionally to their ranges.
    r.bits.resize(m);
    double lo = 0, span = 0;
    for (size_t i = 0; i < m; ++i) {
      r.bits[i] = bits_at(mu_lo, i);
      if (!std::isfinite(c[i])) {
        lo += p.b_min[i];
        span += p.b_max[i] - p.b_min[i];
      }
    }
    const double used = total_at(mu_lo) - lo;
    const double f = span > 0 ? (B - used - lo) / span : 0.0;
    for (size_t i = 0; i < m; ++i) {
      if (!std::isfinite(c[i])) r.bits[i] = p.b_min[i] + f * (p.b_max[i] - p.b_min[i]);
      else {
        r.distortion += p.weight[i] * p.alpha[i] * std::pow(p.beta[i], -r.bits[i]);
        ++r.n_clipped;
      }
    }
    r.log_lambda = -std::numeric_limits<double>::infinity();
    return r;
  }
  for (int it = 0; it < 200 && mu_hi - mu_lo > 1e-13 * (1.0 + std::abs(mu_lo)); ++it) {
    const double mid = 0.5 * (mu_lo + mu_hi);
    if (total_at(mid) > B) mu_lo = mid; else mu_hi = mid;
  }
  double mu = 0.5 * (mu_lo + mu_hi);
  // Closed form on the set left unclipped at μ: Σ_free (c_i − μ)/lb_i = B − Σ_clipped b_i.
  double rest = B, inv = 0.0, acc = 0.0;
  std::vector<char> free_(m, 0);
  for (size_t i = 0; i < m; ++i) {
    const double raw = std::isfinite(c[i]) ? (c[i] - mu) / lb[i] : -std::numeric_limits<double>::infinity();
    if (raw > p.b_min[i] && raw < p.b_max[i]) {
      free_[i] = 1;
      inv += 1.0 / lb[i];
      acc += c[i] / lb[i];
    } else {
      rest -= bits_at(mu, i);
    }
  }
  if (inv > 0.0) {
    const double mu_cf = (acc - rest) / inv;
    bool consistent = true;
    for (size_t i = 0; i < m && consistent; ++i)
      if (free_[i]) {
        const double b = (c[i] - mu_cf) / lb[i];
        consistent = b >= p.b_min[i] - 1e-9 && b <= p.b_max[i] + 1e-9;
      }
    if (consistent) mu = mu_cf;
  }
  r.log_lambda = mu;
  r.bits.resize(m);
  for (size_t i = 0; i < m; ++i) {
    r.bits[i] = free_[i] ? (c[i] - mu) / lb[i] : bits_at(mu, i);
    if (!free_[i]) ++r.n_clipped;
    r.distortion += p.weight[i] * p.alpha[i] * std::pow(p.beta[i], -r.bits[i]);
  }
  return r;
}

namespace {

// The diagnostics of a RateQuantResult at p's code-bit total: the continuous
// relaxation, the distortion of the uniform split b̄ = total_bits / m
// (Σ w_i α_i β_i^−b̄) and the AM/GM ratio of w_i α_i.
void set_diagnostics(const RateQuantProblem& p, RateQuantResult& out) {
  const size_t m = p.weight.size();
  out.relaxed = ratequant_relaxation(p);
  const double bbar = (double)p.total_bits / m;
  std::vector<double> av(m);
  for (size_t i = 0; i < m; ++i) {
    av[i] = p.weight[i] * p.alpha[i];
    out.uniform_distortion += av[i] * std::pow(p.beta[i], -bbar);
  }
  out.am_gm = am_gm_ratio(av);
}

}  // namespace

RateQuantResult allocate_ratequant(const RateQuantProblem& p) {
  check_problem(p);
  RateQuantResult out;
  const Allocation a = allocate_separable_convex(
      p.b_min, p.b_max,
      [&](int i, int b) { return p.weight[i] * p.alpha[i] * std::pow(p.beta[i], -(double)b); }, p.total_bits,
      BudgetMode::Exact, "ratequant");
  out.bits = a.bits;
  out.distortion = a.cost;
  set_diagnostics(p, out);
  return out;
}

RateQuantResult allocate_ratequant_priced(const RateQuantProblem& p0, const std::vector<std::vector<int64_t>>& price,
                                          int64_t budget) {
  RateQuantProblem p = p0;
  p.total_bits = 0;
  for (int b : p.b_min) p.total_bits += b;  // check_problem's budget range: any feasible code total
  check_problem(p);
  const size_t m = p.weight.size();
  check(price.size() == m, "ratequant: {} price rows for {} components", price.size(), m);
  int64_t g = 0, min_total = 0;
  for (size_t i = 0; i < m; ++i) {
    const size_t nw = (size_t)(p.b_max[i] - p.b_min[i] + 1);
    check(price[i].size() == nw, "ratequant: component {}: {} prices for widths {}..{}", i, price[i].size(), p.b_min[i],
          p.b_max[i]);
    for (size_t k = 0; k < nw; ++k) {
      check(price[i][k] >= 0 && (k == 0 || price[i][k] >= price[i][k - 1]),
            "ratequant: component {}: price {} at {} bits: expected ≥ 0 and non-decreasing in the width", i,
            price[i][k], p.b_min[i] + (int)k);
      g = std::gcd(g, price[i][k]);
    }
    min_total += price[i][0];
  }
  check(budget >= min_total,
        "ratequant: budget of {} stored bits per token is below the cheapest allocation (every component at b_min: "
        "{} bits)",
        budget, min_total);
  if (g == 0) g = 1;
  // best[u] after component i: least distortion of components 0..i at total price u·g exactly.
  const int64_t U = budget / g;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> best((size_t)U + 1, kInf), next((size_t)U + 1);
  std::vector<int8_t> choice(m * ((size_t)U + 1), -1);  // width − b_min chosen for component i at total u
  auto cost = [&](size_t i, int b) { return p.weight[i] * p.alpha[i] * std::pow(p.beta[i], -(double)b); };
  best[0] = 0.0;
  for (size_t i = 0; i < m; ++i) {
    std::fill(next.begin(), next.end(), kInf);
    int8_t* ch = choice.data() + i * ((size_t)U + 1);
    for (int64_t u = 0; u <= U; ++u) {
      if (best[(size_t)u] == kInf) continue;
      for (int b = p.b_min[i]; b <= p.b_max[i]; ++b) {
        const int64_t nu = u + price[i][(size_t)(b - p.b_min[i])] / g;
        if (nu > U) break;
        const double c = best[(size_t)u] + cost(i, b);
        if (c < next[(size_t)nu]) {
          next[(size_t)nu] = c;
          ch[nu] = (int8_t)(b - p.b_min[i]);
        }
      }
    }
    std::swap(best, next);
  }
  int64_t bu = -1;
  double bd = kInf;
  for (int64_t u = 0; u <= U; ++u)
    if (best[(size_t)u] < bd) {
      bd = best[(size_t)u];
      bu = u;
    }
  check(bu >= 0, "ratequant: internal error: no allocation within {} stored bits", budget);
  RateQuantResult out;
  out.bits.assign(m, 0);
  int64_t u = bu;
  for (size_t i = m; i-- > 0;) {
    const int k = choice[i * ((size_t)U + 1) + (size_t)u];
    out.bits[i] = p.b_min[i] + k;
    u -= price[i][(size_t)k] / g;
  }
  out.distortion = ratequant_distortion(p, out.bits);
  // Diagnostics of the code-bit problem at the same code total.
  p.total_bits = 0;
  for (int b : out.bits) p.total_bits += b;
  set_diagnostics(p, out);
  return out;
}

UniformSplit best_uniform_split(double avg_bits, const std::function<double(int, int)>& cost) {
  check(std::isfinite(avg_bits) && avg_bits >= 0.0 && avg_bits <= 64.0,
        "uniform split: average of {} bits: expected a finite number in 0..64", avg_bits);
  const double r = std::round(avg_bits);
  if (std::abs(avg_bits - r) < 1e-9) return {(int)r, (int)r, cost((int)r, (int)r)};
  const int hi = (int)std::ceil(avg_bits), lo = (int)std::floor(avg_bits);
  const double c1 = cost(hi, lo), c2 = cost(lo, hi);
  return c2 < c1 ? UniformSplit{lo, hi, c2} : UniformSplit{hi, lo, c1};
}

}  // namespace ratekv::alloc
