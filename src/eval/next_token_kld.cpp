// Next-token KLD, top-1 agreement and Δp (ratekv/eval/next_token_kld.h).
#include "ratekv/eval/next_token_kld.h"

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"

namespace ratekv::eval {

namespace {

// log Σ exp(x) in double, with the max subtracted; also the argmax (lowest index on ties).
double log_sum_exp(const float* x, int n, const char* which, int* arg) {
  float mx = x[0];
  int am = 0;
  for (int v = 0; v < n; ++v) {
    check(std::isfinite(x[v]), "next-token comparison: {} logit {} is {}", which, v, x[v]);
    if (x[v] > mx) {
      mx = x[v];
      am = v;
    }
  }
  double s = 0.0;
  for (int v = 0; v < n; ++v) s += std::exp(static_cast<double>(x[v]) - mx);
  *arg = am;
  return mx + std::log(s);
}

}  // namespace

TokenComparison compare_next_token(const float* ref, const float* test, int n_vocab, int32_t target) {
  check(n_vocab >= 1, "next-token comparison: n_vocab {} (expected ≥ 1)", n_vocab);
  check(target >= 0 && target < n_vocab, "next-token comparison: target token {} outside [0, {})", target, n_vocab);
  int ar = 0, at = 0;
  const double lr = log_sum_exp(ref, n_vocab, "reference", &ar);
  const double lt = log_sum_exp(test, n_vocab, "test", &at);
  double kld = 0.0;
  for (int v = 0; v < n_vocab; ++v) {
    const double lp = static_cast<double>(ref[v]) - lr, lq = static_cast<double>(test[v]) - lt;
    const double p = std::exp(lp);
    if (p > 0.0) kld += p * (lp - lq);
  }
  TokenComparison c;
  c.kld = std::max(kld, 0.0);  // ≥ 0 mathematically; rounding can leave −1e-17
  c.same_top1 = ar == at;
  c.delta_p = std::exp(static_cast<double>(test[target]) - lt) - std::exp(static_cast<double>(ref[target]) - lr);
  return c;
}

double sorted_percentile(const std::vector<double>& v, double fraction) {
  check(!v.empty(), "percentile of no values");
  if (fraction <= 0.0) return v.front();
  if (fraction >= 1.0) return v.back();
  const double p = fraction * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(p);
  const double f = p - static_cast<double>(i);
  return (1.0 - f) * v[i] + f * v[std::min(i + 1, v.size() - 1)];
}

void NextTokenStats::add(const TokenComparison& c) {
  kld_.push_back(c.kld);
  same_ += c.same_top1;
  dp_sum_ += c.delta_p;
  dp_sq_ += c.delta_p * c.delta_p;
}

void NextTokenStats::merge(const NextTokenStats& o) {
  kld_.insert(kld_.end(), o.kld_.begin(), o.kld_.end());
  same_ += o.same_;
  dp_sum_ += o.dp_sum_;
  dp_sq_ += o.dp_sq_;
}

NextTokenSummary NextTokenStats::summary() const {
  check(!kld_.empty(), "next-token statistics: no tokens compared");
  NextTokenSummary s;
  s.n = n();
  const double n = static_cast<double>(s.n);
  double sum = 0.0, sq = 0.0;
  for (double k : kld_) {
    sum += k;
    sq += k * k;
  }
  s.kld_mean = sum / n;
  const double var = sq / n - s.kld_mean * s.kld_mean;
  s.kld_mean_err = s.n > 1 && var > 0 ? std::sqrt(var / (n - 1)) : 0.0;
  std::vector<double> sorted = kld_;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size();
  s.kld_median = m % 2 == 0 ? 0.5 * (sorted[m / 2] + sorted[m / 2 - 1]) : sorted[m / 2];
  s.kld_p90 = sorted_percentile(sorted, 0.90);
  s.kld_p99 = sorted_percentile(sorted, 0.99);
  s.kld_max = sorted.back();
  s.top1 = static_cast<double>(same_) / n;
  s.delta_p_mean = dp_sum_ / n;
  s.delta_p_rms = std::sqrt(dp_sq_ / n);
  return s;
}

nlohmann::json NextTokenSummary::to_json() const {
  return {{"n", n},
          {"kld_mean", kld_mean},
          {"kld_mean_err", kld_mean_err},
          {"kld_median", kld_median},
          {"kld_p90", kld_p90},
          {"kld_p99", kld_p99},
          {"kld_max", kld_max},
          {"top1", top1},
          {"delta_p_mean", delta_p_mean},
          {"delta_p_rms", delta_p_rms}};
}

}  // namespace ratekv::eval
