// ratekv/eval/logit_error.h — the attention-level error of quantized keys
// for one layer and one forward chunk (docs/design.md §3.5 metric, §9.3).
//
// With post-RoPE queries q (n, H, d) and keys k, k̂ (n, Hkv, d) of n tokens at
// positions 0..n−1 (one chunk from a fresh cache; query head g reads KV head
// g / (H/Hkv)):
//   RoPE-logit MAE  = mean over (g, i, j ≤ i) of |q_{g,i}·k_j − q_{g,i}·k̂_j|
//                     (raw dot products, no 1/√d scale)
//   attention KL    = mean over (g, i) of KL(p_{g,i} ‖ p̂_{g,i}) in nats, where
//                     p = softmax_j≤i(scale · q·k_j), p̂ the same with k̂
//                     (values exact: only the keys differ).
//   logit NMSE by query position, per bucket b of query positions i
//                   = Σ (q_{g,i}·k̂_j − q_{g,i}·k_j)² / Σ (q_{g,i}·k_j)²
//                     over (g, i in bucket b, j ≤ i); buckets [0, 64),
//                     [64, 128), [128, 256), … doubling (position_bucket).
//                     The 1/√d scale cancels; sums add over layers, so the
//                     all-layer NMSE of a bucket is Σ_l err / Σ_l ref.
// Query rows can be subsampled deterministically (rows i ≡ 0 mod stride);
// every causal key of a kept row is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ratekv::eval {

/// Width of the first query-position bucket of the logit NMSE (tokens).
inline constexpr int64_t kFirstPositionBucket = 64;

/// Bucket of query position `pos` (≥ 0, the token's index in a window that
/// starts from an empty cache): 0 for [0, 64), b ≥ 1 for [64·2^(b−1), 64·2^b).
/// Throws Error for pos < 0.
int position_bucket(int64_t pos);
/// First position of bucket b (≥ 0): 0, 64, 128, 256, …; the bucket ends
/// where bucket b + 1 begins. Throws Error for b < 0 or b > 40.
int64_t position_bucket_begin(int b);

/// Per-bucket sums of the logit NMSE (index = position_bucket of the query).
struct PositionSums {
  double sq_err = 0.0;  ///< Σ (q·k̂ − q·k)²
  double sq_ref = 0.0;  ///< Σ (q·k)²
  int64_t pairs = 0;    ///< number of (head, query, key) pairs
  /// sq_err / sq_ref; 0 when sq_ref is 0.
  double nmse() const { return sq_ref > 0 ? sq_err / sq_ref : 0.0; }
};

/// Sums behind the means; add chunks and layers' sums with merge().
struct LogitErrorSums {
  double abs_sum = 0.0;  ///< Σ |q·k − q·k̂|
  int64_t pairs = 0;     ///< number of (head, query, key) pairs
  double kl_sum = 0.0;   ///< Σ KL(p ‖ p̂), nats
  int64_t rows = 0;      ///< number of (head, query) rows
  /// by_position[b]: logit NMSE sums of queries in position_bucket b (the
  /// vector is as long as the highest bucket seen + 1).
  std::vector<PositionSums> by_position;
  void merge(const LogitErrorSums& o) {
    abs_sum += o.abs_sum;
    pairs += o.pairs;
    kl_sum += o.kl_sum;
    rows += o.rows;
    if (by_position.size() < o.by_position.size()) by_position.resize(o.by_position.size());
    for (std::size_t b = 0; b < o.by_position.size(); ++b) {
      by_position[b].sq_err += o.by_position[b].sq_err;
      by_position[b].sq_ref += o.by_position[b].sq_ref;
      by_position[b].pairs += o.by_position[b].pairs;
    }
  }
  double mae() const { return pairs ? abs_sum / static_cast<double>(pairs) : 0.0; }
  double kl() const { return rows ? kl_sum / static_cast<double>(rows) : 0.0; }
  /// Logit NMSE over every position (Σ_b sq_err / Σ_b sq_ref); 0 if empty.
  double nmse() const {
    double e = 0.0, r = 0.0;
    for (const auto& b : by_position) e += b.sq_err, r += b.sq_ref;
    return r > 0 ? e / r : 0.0;
  }
};

/// The exact-key side of the comparison for one layer and chunk: per query
/// head the logits q·kᵀ (causal) and the reference log-probabilities, so many
/// quantized key sets can be compared without recomputing them. Query row i
/// is at position i (the chunk starts from an empty cache).
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
