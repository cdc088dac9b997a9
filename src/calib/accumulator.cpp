// KVStatsAccumulator: running double sums of the calibration statistics.
#include "ratekv/calib/accumulator.h"

#include <cblas.h>

#include "ratekv/common/error.h"

namespace ratekv::calib {

KVStatsAccumulator::KVStatsAccumulator(const ModelConfig& cfg) : cfg_(cfg) {
  cfg_.validate("calibration model");
  pairs_ = rope_pairs(cfg_.rope_layout, cfg_.head_dim);
  const size_t L = cfg_.n_layers, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, d = cfg_.head_dim;
  n_.assign(L, 0);
  q_blk_.assign(L * Hkv * (d / 2), 0.0);
  k_blk_.assign(L * Hkv * (d / 2), 0.0);
  k_sum_.assign(L * Hkv * d, 0.0);
  k_outer_.assign(L * Hkv * d * d, 0.0);
  q_sq_.assign(L * H * d, 0.0);
  v_sq_.assign(L * Hkv * d, 0.0);
}

void KVStatsAccumulator::add(const LayerActivations& a) {
  check(a.layer >= 0 && a.layer < cfg_.n_layers, "calibration: layer {} out of range [0, {})", a.layer,
        cfg_.n_layers);
  check(a.n_heads == cfg_.n_heads && a.n_kv_heads == cfg_.n_kv_heads && a.head_dim == cfg_.head_dim,
        "calibration: activations of layer {} have heads {} / kv heads {} / head_dim {}, the model {} / {} / {}",
        a.layer, a.n_heads, a.n_kv_heads, a.head_dim, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim);
  check(a.n >= 1 && a.q_pre && a.q_post && a.k_pre && a.k_post && a.v,
        "calibration: layer {}: empty chunk or missing activation pointer", a.layer);
  const int H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, d = cfg_.head_dim, B = d / 2, ratio = H / Hkv;
  const int64_t n = a.n, qrow = int64_t{H} * d, krow = int64_t{Hkv} * d;
  const size_t l = a.layer;
  for (int64_t t = 0; t < n; ++t) {
    for (int g = 0; g < H; ++g) {
      const float* qp = a.q_post + t * qrow + int64_t{g} * d;
      const float* qq = a.q_pre + t * qrow + int64_t{g} * d;
      double* blk = &q_blk_[(l * Hkv + g / ratio) * B];
      for (int i = 0; i < B; ++i) {
        const double x = qp[pairs_[i][0]], y = qp[pairs_[i][1]];
        blk[i] += x * x + y * y;
      }
      double* sq = &q_sq_[(l * H + g) * d];
      for (int c = 0; c < d; ++c) sq[c] += double{qq[c]} * qq[c];
    }
    for (int h = 0; h < Hkv; ++h) {
      const float* kp = a.k_post + t * krow + int64_t{h} * d;
      const float* kq = a.k_pre + t * krow + int64_t{h} * d;
      const float* vv = a.v + t * krow + int64_t{h} * d;
      double* blk = &k_blk_[(l * Hkv + h) * B];
      for (int i = 0; i < B; ++i) {
        const double x = kp[pairs_[i][0]], y = kp[pairs_[i][1]];
        blk[i] += x * x + y * y;
      }
      double* ks = &k_sum_[(l * Hkv + h) * d];
      double* vs = &v_sq_[(l * Hkv + h) * d];
      for (int c = 0; c < d; ++c) {
        ks[c] += kq[c];
        vs[c] += double{vv[c]} * vv[c];
      }
    }
  }
  // Σ_t k kᵀ per head: (d × n)·(n × d) with the head's channels strided by krow.
  std::vector<float> outer(static_cast<size_t>(d) * d);
  for (int h = 0; h < Hkv; ++h) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, static_cast<int>(n), 1.0f, a.k_pre + int64_t{h} * d,
                static_cast<int>(krow), a.k_pre + int64_t{h} * d, static_cast<int>(krow), 0.0f, outer.data(), d);
    double* acc = &k_outer_[(l * Hkv + h) * d * d];
    for (size_t i = 0; i < outer.size(); ++i) acc[i] += outer[i];
  }
  n_[l] += n;
}

KVStats KVStatsAccumulator::finish() const {
  const int64_t N = n_[0];
  check(N > 0, "calibration: no tokens were processed");
  for (int l = 0; l < cfg_.n_layers; ++l)
    check(n_[l] == N, "calibration: layer {} saw {} tokens, layer 0 saw {}", l, n_[l], N);
  // One token has a key covariance of 0: statistics of nothing (the CLI's --tokens refused it, `panel
  // --calib-tokens 1` and Python's calibrate ran on it).
  check(N >= 2, "calibration: 1 token was processed; at least 2 are needed (the key covariance of one token is 0)");
  const int H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, d = cfg_.head_dim, ratio = H / Hkv;
  KVStats s;
  s.model = model_identity(cfg_);
  s.n_heads = H;
  s.n_tokens = N;
  const double inv = 1.0 / static_cast<double>(N);
  s.q_block_energy = q_blk_;
  for (double& x : s.q_block_energy) x *= inv / ratio;
  s.k_block_energy = k_blk_;
  for (double& x : s.k_block_energy) x *= inv;
  s.k_pre_mean = k_sum_;
  for (double& x : s.k_pre_mean) x *= inv;
  s.q_pre_sq = q_sq_;
  for (double& x : s.q_pre_sq) x *= inv;
  s.v_sq = v_sq_;
  for (double& x : s.v_sq) x *= inv;
  s.k_pre_cov.resize(k_outer_.size());
  const size_t heads = static_cast<size_t>(cfg_.n_layers) * Hkv;
  for (size_t lh = 0; lh < heads; ++lh) {
    const double* mu = &s.k_pre_mean[lh * d];
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) {
        const size_t at = (lh * d + i) * d + j;
        s.k_pre_cov[at] = k_outer_[at] * inv - mu[i] * mu[j];
      }
  }
  return s;
}

}  // namespace ratekv::calib
