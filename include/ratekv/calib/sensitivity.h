// ratekv/calib/sensitivity.h — gradient sensitivity of the K/V cache
// (RateQuant, docs/design.md §4.1): per layer l, KV head h and channel c, the mean
// over calibration tokens of the squared gradient of the causal LM loss with
// respect to the cached key (pre- and post-RoPE) and value. The allocators'
// w_{l,h} is the sum over channels (KVStats::to_alloc_stats, "grad").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ratekv/model/model.h"

namespace ratekv::calib {

/// Mean squared K/V gradients over S sequences of T tokens each
/// (model_backward.h: L = mean next-token cross-entropy of one sequence,
/// positions 0 .. T−1, full causal attention). Means run over all S·T tokens,
/// including each sequence's last token, whose gradient is exactly 0.
/// Layouts (n_layers, n_kv_heads, head_dim) row-major.
struct GradSensitivity {
  int64_t n_sequences = 0;  ///< S
  int64_t seq_len = 0;      ///< T
  double mean_loss = 0.0;   ///< mean over sequences of L (nats)
  std::vector<double> k_pre_sq;   ///< E_t (∂L/∂k_pre_{l,h,t,c})²
  std::vector<double> k_post_sq;  ///< E_t (∂L/∂k_post_{l,h,t,c})²
  std::vector<double> v_sq;       ///< E_t (∂L/∂v_{l,h,t,c})²
};

/// Runs the backward pass (float) over sequences s = 0 .. n_sequences−1,
/// sequence s being tokens[s·seq_len, (s+1)·seq_len), and averages the squared
/// gradients. Progress ("calibrate: sensitivity") on stderr. Deterministic for
/// fixed tokens (OpenBLAS / OpenMP thread count fixed). Throws ParamError
/// ("gradient_sensitivity.n_sequences" / ".seq_len") for n_sequences < 1,
/// seq_len < 2 or beyond the model's position limit; Error for fewer than
/// n_sequences·seq_len tokens or an architecture the backward pass does not
/// serve (check_backward_arch: llama, gemma3 and qwen2 are served).
GradSensitivity gradient_sensitivity(const Model& model, std::span<const int32_t> tokens, int64_t n_sequences,
                                     int64_t seq_len);

}  // namespace ratekv::calib
