// ratekv/tasq/channel_weights.h — TaSQ's query-guided per-channel key
// weights (docs/design.md §5.1).
//
// A pre-RoPE key error δ at position p changes the logit of a query at t ≥ p
// by (R_{t−p} q_t)ᵀ δ (q_t pre-RoPE). Over all causal pairs (t, p) of the
// calibration windows and the GQA group G(h) of KV head h:
//   Ã_h = E_{t≥p, g∈G(h)} [(R_{t−p} q_{g,t})(R_{t−p} q_{g,t})ᵀ],  w_h = diag(Ã_h).
// For RoPE block i with channels (a, b), angle ω_i Δ, Δ = t − p:
//   (R_Δ q)_a² = q_a² cos² + q_b² sin² − 2 q_a q_b sin·cos
//   (R_Δ q)_b² = q_a² sin² + q_b² cos² + 2 q_a q_b sin·cos
// so a query at window offset t contributes q_a² C_i(m) + q_b² S_i(m) − 2 q_a q_b X_i(m)
// with the prefix sums C_i(m) = Σ_{Δ=0..m} cos²(ω_i Δ), S_i, X_i likewise,
// over the offsets the query can see: m = t for a global layer, m =
// min(t, window − 1) for a sliding-window layer (it sees keys at > t − window,
// as AttnParams::sliding_window). ω_i comes from the layer's own RoPE base
// (ModelConfig::layer_rope_theta: Gemma 3's sliding layers use 1e4, its global
// ones 1e6). Exact, O(T·d) per window. The two channels of a pair can get
// different weights (a low-frequency pair barely rotates over a window).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ratekv/model/model.h"

namespace ratekv::tasq {

/// Accumulates diag(Ã) for every (layer, KV head) from the forward hooks of
/// windows that start at position 0 (each from a fresh cache). Angles follow
/// the model's RoPE (layout, each layer's base); the causal pairs are those
/// each layer's attention sees (its sliding window). Sums in double.
class QueryWeightAccumulator {
 public:
  /// Throws Error for an invalid config.
  explicit QueryWeightAccumulator(const ModelConfig& cfg);
  /// Adds one layer's activations (uses q_pre and pos). Positions are window
  /// offsets t ≥ 0 (keys at 0..t are visible). Throws Error on a shape that
  /// differs from the config, a negative position, or a layer out of range.
  void add(const LayerActivations& a);
  /// diag(Ã) per (layer, KV head, channel): (L, Hkv, d), each a mean over the
  /// causal pairs and the GQA group. Throws Error when a layer saw no pairs.
  std::vector<double> finish() const;

 private:
  void grow(int64_t t_max);
  // Prefix sums of cos², sin², sin·cos over offsets for one RoPE base.
  struct Table {
    double theta = 0;
    std::vector<double> c2, s2, sc;  // (T_cap, d/2)
  };
  ModelConfig cfg_;
  std::vector<std::array<int, 2>> pairs_;
  std::vector<Table> tables_;     // one per distinct base (global first)
  std::vector<int> layer_table_;  // (L) index into tables_
  int64_t t_cap_ = 0;
  std::vector<double> sum_;           // (L, Hkv, d)
  std::vector<double> n_pairs_;       // (L): Σ (t+1) · |G(h)|
};

/// Per-head weight normalization (docs/design.md §5.2): each head's d weights
/// scaled to unit mean. w (n_heads_total, d) in place; a head whose weights
/// are all 0 becomes all ones. Throws Error on a negative or non-finite weight.
void normalize_unit_mean(std::vector<double>& w, int head_dim);

}  // namespace ratekv::tasq
