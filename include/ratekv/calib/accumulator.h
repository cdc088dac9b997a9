// ratekv/calib/accumulator.h — accumulates KVStats (kv_stats.h) from the
// per-layer activations the forward pass hands to ForwardHooks.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ratekv/calib/kv_stats.h"
#include "ratekv/model/model.h"

namespace ratekv::calib {

/// Running sums of every statistic in kv_stats.h, in double. One instance per
/// calibration run; add() must see every layer of every chunk exactly once
/// (finish() checks that all layers saw the same number of tokens, at least 2).
class KVStatsAccumulator {
 public:
  /// Throws Error for an invalid config (via ModelConfig::validate).
  explicit KVStatsAccumulator(const ModelConfig& cfg);

  /// Adds one layer's activations of one chunk (layouts in model.h). Throws
  /// Error when the shapes differ from the config or the layer is out of range.
  /// Per chunk and head, Σ kkᵀ is formed with one fp32 sgemm over the chunk's
  /// tokens and then added in double.
  void add(const LayerActivations& a);

  /// Tokens seen by layer 0 so far.
  int64_t n_tokens() const { return n_[0]; }

  /// Means and covariance over everything added. Identity fields (model file,
  /// text, ctx) are left for the caller. Throws Error if fewer than 2 tokens were
  /// added (one token's key covariance is 0) or the layers saw different token counts.
  KVStats finish() const;

 private:
  ModelConfig cfg_;
  std::vector<std::array<int, 2>> pairs_;
  std::vector<int64_t> n_;  // tokens per layer
  std::vector<double> q_blk_, k_blk_, k_sum_, k_outer_, q_sq_, v_sq_;
};

}  // namespace ratekv::calib
