// Lloyd–Max codebooks for the exact sphere-coordinate density f_m.
#include "ratekv/quant/lloyd_max.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include "ratekv/common/error.h"

namespace ratekv::quant {

namespace {

constexpr double kPi = 3.141592653589793238462643;

void check_m(int m) { check(m >= 2 && m <= (1 << 20), "Lloyd–Max: dimension m = {} is out of range (expected 2..2^20)", m); }

// Normalizer C = Γ(m/2) / (√π Γ((m−1)/2)).
double norm_const(int m) { return std::exp(std::lgamma(0.5 * m) - std::lgamma(0.5 * (m - 1)) - 0.5 * std::log(kPi)); }

// I_n(φ) = ∫_0^φ cos^n θ dθ, φ ∈ [0, π/2], by the upward recurrence (all terms ≥ 0).
double cos_power_integral(int n, double phi) {
  const double s = std::sin(phi), c = std::cos(phi);
  double i_prev = (n % 2 == 0) ? phi : s;  // I_0 or I_1
  double cpow = (n % 2 == 0) ? c : c * c;  // cos^(k−1) for the first k below
  for (int k = (n % 2 == 0) ? 2 : 3; k <= n; k += 2) {
    i_prev = cpow * s / k + (double)(k - 1) / k * i_prev;
    cpow *= c * c;
  }
  return i_prev;
}

struct Density {
  int m;
  double C;
  explicit Density(int m_) : m(m_), C(norm_const(m_)) {}
  double cdf(double t) const {
    if (t <= -1.0) return 0.0;
    if (t >= 1.0) return 1.0;
    const double v = C * cos_power_integral(m - 2, std::asin(std::fabs(t)));
    return t >= 0 ? 0.5 + v : 0.5 - v;
  }
  // G(t) = (1−t²)^((m−1)/2); ∫_a^b t f = C/(m−1)·(G(a) − G(b)).
  double g(double t) const {
    const double u = std::max(0.0, 1.0 - t * t);
    return std::pow(u, 0.5 * (m - 1));
  }
  double density(double t) const { return C * std::pow(std::max(0.0, 1.0 - t * t), 0.5 * (m - 3)); }
  double first_moment(double a, double b) const { return C / (m - 1) * (g(a) - g(b)); }
  double mass(double a, double b) const { return cdf(b) - cdf(a); }
};

// Start from the high-resolution optimum (Panter–Dite): levels at the
// quantiles of g ∝ f_m^(1/3). In θ (t = sin θ) its mass is cos^((m−3)/3+1)θ dθ,
// integrated by the trapezoid rule on a fine grid (only a starting point).
void compander_init(int m, std::vector<double>& c) {
  const int K = (int)c.size();
  const int N = 1 << 16;
  const double e = (m - 3) / 3.0 + 1.0;
  std::vector<double> cum(N + 1, 0.0);
  auto w = [&](int i) { return std::pow(std::max(0.0, std::cos(-0.5 * kPi + kPi * i / N)), e); };
  for (int i = 0; i < N; ++i) cum[i + 1] = cum[i] + 0.5 * (w(i) + w(i + 1));
  int i = 0;
  for (int j = 0; j < K; ++j) {
    const double target = (j + 0.5) / K * cum[N];
    while (i < N - 1 && cum[i + 1] < target) ++i;
    const double fr = (target - cum[i]) / std::max(1e-300, cum[i + 1] - cum[i]);
    c[j] = std::sin(-0.5 * kPi + kPi * (i + fr) / N);
  }
}

Codebook compute(int m, int bits) {
  const Density f(m);
  const int K = 1 << bits;
  std::vector<double> c(K), t(K + 1);
  compander_init(m, c);
  const double tol = 1e-13 / std::sqrt((double)m);
  auto thresholds = [&](const std::vector<double>& lv) {
    t[0] = -1.0;
    t[K] = 1.0;
    for (int j = 1; j < K; ++j) t[j] = 0.5 * (lv[j - 1] + lv[j]);
  };
  auto centroid = [&](int j) {
    const double p = f.mass(t[j], t[j + 1]);
    return p > 0 ? f.first_moment(t[j], t[j + 1]) / p : 0.5 * (t[j] + t[j + 1]);
  };
  int it = 0;
  // A few plain Lloyd steps, then Newton on r(c) = c − centroid(c), whose
  // Jacobian is tridiagonal: for cell j = [a, b] with mass P and centroid μ,
  // ∂μ/∂b = f(b)(b − μ)/P, ∂μ/∂a = f(a)(μ − a)/P, and a, b move by half of
  // each neighbouring level. Steps are damped to keep levels inside (−1, 1)
  // and ascending; every step must reduce max|r|.
  for (; it < 20; ++it) {
    thresholds(c);
    for (int j = 0; j < K; ++j) c[j] = centroid(j);
  }
  std::vector<double> r(K), lo(K), di(K), up(K), step(K), trial(K);
  auto residual = [&](const std::vector<double>& lv, std::vector<double>& out) {
    thresholds(lv);
    double mx = 0.0;
    for (int j = 0; j < K; ++j) {
      out[j] = lv[j] - centroid(j);
      mx = std::max(mx, std::fabs(out[j]));
    }
    return mx;
  };
  double rmax = residual(c, r);
  for (int newton = 0; newton < 200 && rmax > tol; ++newton, ++it) {
    for (int j = 0; j < K; ++j) {
      const double a = t[j], b = t[j + 1];
      const double P = f.mass(a, b), mu = centroid(j);
      const double da = j > 0 ? f.density(a) * (mu - a) / P : 0.0;      // ∂μ/∂a
      const double db = j + 1 < K ? f.density(b) * (b - mu) / P : 0.0;  // ∂μ/∂b
      lo[j] = -0.5 * da;
      di[j] = 1.0 - 0.5 * da - 0.5 * db;
      up[j] = -0.5 * db;
      step[j] = -r[j];
    }
    // Thomas algorithm.
    for (int j = 1; j < K; ++j) {
      const double w = lo[j] / di[j - 1];
      di[j] -= w * up[j - 1];
      step[j] -= w * step[j - 1];
    }
    step[K - 1] /= di[K - 1];
    for (int j = K - 2; j >= 0; --j) step[j] = (step[j] - up[j] * step[j + 1]) / di[j];
    double lambda = 1.0;
    bool accepted = false;
    for (int half = 0; half < 40 && !accepted; ++half, lambda *= 0.5) {
      bool ok = true;
      for (int j = 0; j < K; ++j) {
        trial[j] = c[j] + lambda * step[j];
        if (!(trial[j] > -1.0 && trial[j] < 1.0) || (j > 0 && !(trial[j] > trial[j - 1]))) ok = false;
      }
      if (!ok) continue;
      std::vector<double> rt(K);
      const double rm = residual(trial, rt);
      if (rm < rmax) {
        c = trial;
        r = rt;
        rmax = rm;
        accepted = true;
      }
    }
    if (!accepted) break;  // at the floating-point floor
  }
  // Restore exact symmetry (the density is even).
  for (int j = 0; j < K / 2; ++j) {
    const double v = 0.5 * (c[K - 1 - j] - c[j]);
    c[j] = -v;
    c[K - 1 - j] = v;
  }
  Codebook cb;
  cb.m = m;
  cb.bits = bits;
  cb.iterations = it;
  cb.levels_f64 = c;
  cb.levels.assign(c.begin(), c.end());
  for (int j = 1; j < K; ++j) cb.thresholds.push_back((float)(0.5 * (c[j - 1] + c[j])));
  cb.distortion = codebook_distortion(m, c);
  return cb;
}

}  // namespace

double sphere_coord_density(int m, double t) {
  check_m(m);
  if (t <= -1.0 || t >= 1.0) return 0.0;
  return norm_const(m) * std::pow(1.0 - t * t, 0.5 * (m - 3));
}

double sphere_coord_cdf(int m, double t) {
  check_m(m);
  return Density(m).cdf(t);
}

double codebook_distortion(int m, const std::vector<double>& levels) {
  check_m(m);
  check(!levels.empty() && std::is_sorted(levels.begin(), levels.end()),
        "codebook_distortion: levels must be non-empty and ascending");
  const Density f(m);
  const size_t K = levels.size();
  // E(t − c)² over a cell = ∫t²f − 2c∫tf + c²∫f; Σ∫t²f = E t² = 1/m.
  double d = 1.0 / m;
  for (size_t j = 0; j < K; ++j) {
    const double a = j == 0 ? -1.0 : 0.5 * (levels[j - 1] + levels[j]);
    const double b = j + 1 == K ? 1.0 : 0.5 * (levels[j] + levels[j + 1]);
    d += -2.0 * levels[j] * f.first_moment(a, b) + levels[j] * levels[j] * f.mass(a, b);
  }
  return m * d;
}

const Codebook& lloyd_max_codebook(int m, int bits) {
  check_m(m);
  check(bits >= 1 && bits <= 8, "Lloyd–Max: bits = {} is out of range (expected 1..8)", bits);
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<Codebook>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{m, bits}];
  if (!slot) slot = std::make_unique<Codebook>(compute(m, bits));
  return *slot;
}

}  // namespace ratekv::quant
