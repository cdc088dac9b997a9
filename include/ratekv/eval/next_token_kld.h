// ratekv/eval/next_token_kld.h — how far a quantized cache moves the model's
// next-token distribution from a reference cache's, with the statistics
// `llama-perplexity --kl-divergence` reports (docs/design.md §9.3).
//
// Per scored token t (the same positions perplexity scores) with reference
// logits r and test logits x over the vocabulary (V values each):
//   p = softmax(r), q = softmax(x)                     (in double, max subtracted)
//   KLD_t  = KL(p ‖ q) = Σ_v p_v (log p_v − log q_v)   nats, ≥ 0
//   top1_t = [argmax_v r_v = argmax_v x_v]             (ties: the lowest index)
//   Δp_t   = q_target − p_target                       (probability of the next token)
// Summary over tokens, as llama.cpp's perplexity tool prints it: mean KLD with
// its standard error sqrt(var / (n − 1)), median (mean of the two middle values
// when n is even), the 99th and 90th percentiles (linear interpolation at
// fraction · (n − 1) of the sorted values), maximum; "same top p" = mean of
// top1; mean Δp and RMS Δp.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace ratekv::eval {

/// One token's comparison (see the file comment).
struct TokenComparison {
  double kld = 0.0;
  bool same_top1 = false;
  double delta_p = 0.0;
};

/// Compares reference logits `ref` with test logits `test` (n_vocab floats
/// each) for next token `target`. Throws Error for n_vocab < 1, a target
/// outside [0, n_vocab) or a non-finite logit (naming which row).
TokenComparison compare_next_token(const float* ref, const float* test, int n_vocab, int32_t target);

/// The summary of many tokens.
struct NextTokenSummary {
  int64_t n = 0;             ///< tokens compared
  double kld_mean = 0.0;     ///< nats
  double kld_mean_err = 0.0; ///< standard error of the mean
  double kld_median = 0.0;
  double kld_p90 = 0.0;
  double kld_p99 = 0.0;
  double kld_max = 0.0;
  double top1 = 0.0;         ///< fraction of tokens whose argmax agrees, 0..1
  double delta_p_mean = 0.0; ///< mean of q_target − p_target (probability, not %)
  double delta_p_rms = 0.0;
  /// {"n", "kld_mean", "kld_mean_err", "kld_median", "kld_p90", "kld_p99", "kld_max", "top1",
  ///  "delta_p_mean", "delta_p_rms"}.
  nlohmann::json to_json() const;
};

/// Collects per-token comparisons; summary() sorts a copy of the KLD values.
class NextTokenStats {
 public:
  void add(const TokenComparison& c);
  /// Adds every token of another accumulator (e.g. another window).
  void merge(const NextTokenStats& o);
  int64_t n() const { return static_cast<int64_t>(kld_.size()); }
  /// Throws Error when no token was added.
  NextTokenSummary summary() const;

 private:
  std::vector<double> kld_;
  int64_t same_ = 0;
  double dp_sum_ = 0.0, dp_sq_ = 0.0;
};

/// Percentile of sorted values by linear interpolation at fraction · (n − 1)
/// (llama.cpp's rule); fraction clamped to [0, 1]. Throws Error when empty.
double sorted_percentile(const std::vector<double>& sorted, double fraction);

}  // namespace ratekv::eval
