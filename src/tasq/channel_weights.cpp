// Query-guided channel weights by prefix sums over RoPE offsets (ratekv/tasq/channel_weights.h).
#include "ratekv/tasq/channel_weights.h"

#include <cmath>

#include "ratekv/common/error.h"

namespace ratekv::tasq {

QueryWeightAccumulator::QueryWeightAccumulator(const ModelConfig& cfg) : cfg_(cfg) {
  cfg_.validate("QueryWeightAccumulator");
  pairs_ = rope_pairs(cfg_.rope_layout, cfg_.head_dim);
  sum_.assign(static_cast<size_t>(cfg_.n_layers) * cfg_.n_kv_heads * cfg_.head_dim, 0.0);
  n_pairs_.assign(cfg_.n_layers, 0.0);
}

void QueryWeightAccumulator::grow(int64_t t_max) {
  if (t_max < t_cap_) return;
  const int B = cfg_.head_dim / 2;
  const int64_t cap = std::max<int64_t>(t_max + 1, 2 * t_cap_);
  c2_.resize(cap * B);
  s2_.resize(cap * B);
  sc_.resize(cap * B);
  for (int64_t t = t_cap_; t < cap; ++t)
    for (int i = 0; i < B; ++i) {
      const double ang = static_cast<double>(t) * rope_frequency(i, cfg_.head_dim, cfg_.rope_theta);
      const double c = std::cos(ang), s = std::sin(ang);
      const double pc = t > 0 ? c2_[(t - 1) * B + i] : 0.0, ps = t > 0 ? s2_[(t - 1) * B + i] : 0.0,
                   px = t > 0 ? sc_[(t - 1) * B + i] : 0.0;
      c2_[t * B + i] = pc + c * c;
      s2_[t * B + i] = ps + s * s;
      sc_[t * B + i] = px + s * c;
    }
  t_cap_ = cap;
}

void QueryWeightAccumulator::add(const LayerActivations& a) {
  check(a.layer >= 0 && a.layer < cfg_.n_layers, "QueryWeightAccumulator: layer {} outside 0..{}", a.layer,
        cfg_.n_layers - 1);
  check(a.n_heads == cfg_.n_heads && a.n_kv_heads == cfg_.n_kv_heads && a.head_dim == cfg_.head_dim,
        "QueryWeightAccumulator: activations shape (heads {}, KV heads {}, head_dim {}) differs from the model",
        a.n_heads, a.n_kv_heads, a.head_dim);
  const int d = cfg_.head_dim, B = d / 2, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, gqa = cfg_.gqa_ratio();
  int64_t t_max = 0;
  for (int64_t j = 0; j < a.n; ++j) {
    check(a.pos[j] >= 0, "QueryWeightAccumulator: negative position {}", a.pos[j]);
    t_max = std::max<int64_t>(t_max, a.pos[j]);
  }
  grow(t_max);
  double* acc = sum_.data() + static_cast<size_t>(a.layer) * Hkv * d;
  for (int64_t j = 0; j < a.n; ++j) {
    const int64_t t = a.pos[j];
    const double* C = c2_.data() + t * B;
    const double* S = s2_.data() + t * B;
    const double* X = sc_.data() + t * B;
    for (int g = 0; g < H; ++g) {
      const float* q = a.q_pre + (j * H + g) * static_cast<int64_t>(d);
      double* w = acc + static_cast<size_t>(g / gqa) * d;
      for (int i = 0; i < B; ++i) {
        const int ca = pairs_[i][0], cb = pairs_[i][1];
        const double qa = q[ca], qb = q[cb];
        w[ca] += qa * qa * C[i] + qb * qb * S[i] - 2.0 * qa * qb * X[i];
        w[cb] += qa * qa * S[i] + qb * qb * C[i] + 2.0 * qa * qb * X[i];
      }
    }
    n_pairs_[a.layer] += static_cast<double>(t + 1) * gqa;
  }
}

std::vector<double> QueryWeightAccumulator::finish() const {
  const int d = cfg_.head_dim, Hkv = cfg_.n_kv_heads;
  std::vector<double> w(sum_.size());
  for (int l = 0; l < cfg_.n_layers; ++l) {
    check(n_pairs_[l] > 0, "QueryWeightAccumulator: layer {} saw no query-key pairs", l);
    for (int i = 0; i < Hkv * d; ++i) {
      const size_t o = static_cast<size_t>(l) * Hkv * d + i;
      w[o] = sum_[o] / n_pairs_[l];
    }
  }
  return w;
}

std::vector<double> query_weights_bruteforce(const float* q_pre, int64_t T, int n_heads, int n_kv_heads,
                                             int head_dim, RopeLayout layout, double theta) {
  const int d = head_dim, gqa = n_heads / n_kv_heads;
  std::vector<double> w(static_cast<size_t>(n_kv_heads) * d, 0.0);
  std::vector<double> n(n_kv_heads, 0.0);
  const auto pairs = rope_pairs(layout, d);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t p = 0; p <= t; ++p)
      for (int g = 0; g < n_heads; ++g) {
        const float* q = q_pre + (t * n_heads + g) * static_cast<int64_t>(d);
        for (int i = 0; i < d / 2; ++i) {
          const double ang = static_cast<double>(t - p) * rope_frequency(i, d, theta);
          const double c = std::cos(ang), s = std::sin(ang);
          const double qa = q[pairs[i][0]], qb = q[pairs[i][1]];
          const double ra = qa * c - qb * s, rb = qa * s + qb * c;
          w[static_cast<size_t>(g / gqa) * d + pairs[i][0]] += ra * ra;
          w[static_cast<size_t>(g / gqa) * d + pairs[i][1]] += rb * rb;
        }
        n[g / gqa] += 1.0;
      }
  for (int h = 0; h < n_kv_heads; ++h)
    for (int c = 0; c < d; ++c) w[static_cast<size_t>(h) * d + c] /= n[h];
  return w;
}

void normalize_unit_mean(std::vector<double>& w, int head_dim) {
  check(head_dim > 0 && w.size() % head_dim == 0, "normalize_unit_mean: {} weights are not whole heads of {}",
        w.size(), head_dim);
  for (size_t h = 0; h < w.size() / head_dim; ++h) {
    double m = 0.0;
    for (int c = 0; c < head_dim; ++c) {
      const double x = w[h * head_dim + c];
      check(std::isfinite(x) && x >= 0.0, "normalize_unit_mean: weight {} of head {} is {}", c, h, x);
      m += x;
    }
    m /= head_dim;
    for (int c = 0; c < head_dim; ++c) w[h * head_dim + c] = m > 0.0 ? w[h * head_dim + c] / m : 1.0;
  }
}

}  // namespace ratekv::tasq
