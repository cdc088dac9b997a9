// ratekv/eval/logit_error.h — the attention-level error of quantized keys
// for one layer and one forward chunk (DESIGN.md §3 metric, §9).
//
// With post-RoPE queries q (n, H, d) and keys k, k̂ (n, Hkv, d) of n tokens at
// positions 0..n−1 (one chunk from a fresh cache; query head g reads KV head
// g / (H/Hkv)):
//   RoPE-logit MAE  = mean over (g, i, j ≤ i) of |q_{g,i}·k_j − q_{g,i}·k̂_j|
//                     (raw dot products, no 1/√d scale)
//   attention KL    = mean over (g, i) of KL(p_{g,i} ‖ p̂_{g,i}) in nats, where
//                     p = softmax_j≤i(scale · q·k_j), p̂ the same with k̂
//                     (values exact: only the keys differ).
// Query rows can be subsampled deterministically (rows i ≡ 0 mod stride);
// every causal key of a kept row is used.
#pragma once

#include <cstdint>
#include <vector>

namespace ratekv::eval {

/// Sums behind the two means; add chunks and layers' sums with merge().
struct LogitErrorSums {
  double abs_sum = 0.0;  ///< Σ |q·k − q·k̂|
  int64_t pairs = 0;     ///< number of (head, query, key) pairs
  double kl_sum = 0.0;   ///< Σ KL(p ‖ p̂), nats
  int64_t rows = 0;      ///< number of (head, query) rows
  void merge(const LogitErrorSums& o) {
    abs_sum += o.abs_sum;
    pairs += o.pairs;
    kl_sum += o.kl_sum;
    rows += o.rows;
  }
  double mae() const { return pairs ? abs_sum / static_cast<double>(pairs) : 0.0; }
  double kl() const { return rows ? kl_sum / static_cast<double>(rows) : 0.0; }
};

/// The exact-key side of the comparison for one layer and chunk: per query
/// head the logits q·kᵀ (causal) and the reference log-probabilities, so many
/// quantized key sets can be compared without recomputing them.
class LogitErrorReference {
 public:
  /// q: (n, n_heads, d), k: (n, n_kv_heads, d), post-RoPE; pointers need only
  /// live during the constructor. scale = the attention logit scale (> 0).
  /// query_stride ≥ 1. Throws Error on bad shapes or a non-positive scale.
  LogitErrorReference(const float* q, const float* k, int64_t n, int n_heads, int n_kv_heads, int head_dim,
                      float scale, int64_t query_stride = 1);

  /// Compares quantized keys khat (n, n_kv_heads, d) with the reference.
  /// Thread-safe (const).
  LogitErrorSums compare(const float* khat) const;

  int64_t n() const { return n_; }

 private:
  int64_t n_, stride_, rows_;
  int H_, Hkv_, d_;
  float scale_;
  std::vector<float> q_;     // (rows_, H, d) kept query rows
  std::vector<float> s_;     // (H, rows_, n) raw logits q·k (causal part valid)
  std::vector<float> logp_;  // (H, rows_, n) reference log-probabilities
};

/// One-shot convenience: LogitErrorReference(q, k, ...).compare(khat).
LogitErrorSums logit_error(const float* q, const float* k, const float* khat, int64_t n, int n_heads,
                           int n_kv_heads, int head_dim, float scale, int64_t query_stride = 1);

}  // namespace ratekv::eval
