// Query-guided channel weights by prefix sums over RoPE offsets (ratekv/tasq/channel_weights.h).
#include "ratekv/tasq/channel_weights.h"

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"

namespace ratekv::tasq {

QueryWeightAccumulator::QueryWeightAccumulator(const ModelConfig& cfg) : cfg_(cfg) {
  cfg_.validate("QueryWeightAccumulator");
  pairs_ = rope_pairs(cfg_.rope_layout, cfg_.head_dim);
  sum_.assign(static_cast<size_t>(cfg_.n_layers) * cfg_.n_kv_heads * cfg_.head_dim, 0.0);
  n_pairs_.assign(cfg_.n_layers, 0.0);
  // One prefix-sum table per distinct RoPE base: the global base, and the
  // sliding layers' base when some layer slides (Gemma 3: 1e6 and 1e4).
  tables_.push_back({cfg_.rope_theta, {}, {}, {}});
  layer_table_.assign(cfg_.n_layers, 0);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const double theta = cfg_.layer_rope_theta(l);
    size_t k = 0;
    while (k < tables_.size() && tables_[k].theta != theta) ++k;
    if (k == tables_.size()) tables_.push_back({theta, {}, {}, {}});
    layer_table_[l] = static_cast<int>(k);
  }
}

void QueryWeightAccumulator::grow(int64_t t_max) {
  if (t_max < t_cap_) return;
  const int B = cfg_.head_dim / 2;
  const int64_t cap = std::max<int64_t>(t_max + 1, 2 * t_cap_);
  for (Table& tb : tables_) {
    tb.c2.resize(cap * B);
    tb.s2.resize(cap * B);
    tb.sc.resize(cap * B);
    for (int64_t t = t_cap_; t < cap; ++t)
      for (int i = 0; i < B; ++i) {
        const double ang = static_cast<double>(t) * rope_frequency(i, cfg_.head_dim, tb.theta);
        const double c = std::cos(ang), s = std::sin(ang);
        const double pc = t > 0 ? tb.c2[(t - 1) * B + i] : 0.0, ps = t > 0 ? tb.s2[(t - 1) * B + i] : 0.0,
                     px = t > 0 ? tb.sc[(t - 1) * B + i] : 0.0;
        tb.c2[t * B + i] = pc + c * c;
        tb.s2[t * B + i] = ps + s * s;
        tb.sc[t * B + i] = px + s * c;
      }
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
  const Table& tb = tables_[layer_table_[a.layer]];
  const int64_t window = cfg_.layer_window(a.layer);
  double* acc = sum_.data() + static_cast<size_t>(a.layer) * Hkv * d;
  for (int64_t j = 0; j < a.n; ++j) {
    // The query at offset t sees the keys at t − Δ for Δ = 0 .. Δmax: every
    // earlier key, or only those inside a sliding layer's window (Δ < window).
    const int64_t t = a.pos[j], dmax = window > 0 ? std::min<int64_t>(t, window - 1) : t;
    const double* C = tb.c2.data() + dmax * B;
    const double* S = tb.s2.data() + dmax * B;
    const double* X = tb.sc.data() + dmax * B;
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
    n_pairs_[a.layer] += static_cast<double>(dmax + 1) * gqa;
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
