// ratekv/engine/sampling.h — how the GPU engine picks a token from a row of
// logits (engine issue 2 of 3): greedy (the default) or temperature / top-k
// / top-p sampling, reproducible from a seed. The GPU kernel
// (cuda::sample_rows, model_kernels.h) and the host reference here implement
// the same definition:
//   temperature ≤ 0: argmax (the smallest index among equal maxima);
//   else z_i = logit_i / temperature; with top_k > 0 only z_i ≥ the k-th
//   largest z are kept (ties kept); weights w_i = exp(z_i − max z); with
//   top_p < 1 only z_i ≥ τ are kept, τ the largest value with
//   Σ_{z_j ≥ τ} w_j ≥ top_p · Σ w (over the kept tokens); the token is the
//   smallest index j with Σ_{i ≤ j, kept} w_i > u · Σ_{kept} w, u uniform in
//   [0, 1) from sampling_uniform(seed, step).
// Host-only (no CUDA types): in the host library ratekv_engine_host.
#pragma once

#include <cstdint>
#include <string>

namespace ratekv::engine {

/// Per-request sampling settings. Errors (validate): temperature not finite
/// or < 0, top_k < 0, top_p outside (0, 1].
struct SamplingParams {
  float temperature = 0.f;  ///< 0: greedy
  int top_k = 0;            ///< 0: all tokens
  float top_p = 1.f;        ///< 1: no nucleus cut
  uint64_t seed = 0;        ///< the request's seed (sampling_uniform)
  bool greedy() const { return !(temperature > 0.f); }
  /// Throws Error naming the field ("SamplingParams.top_p …").
  void validate() const;
};

/// The uniform number in [0, 1) that picks token number `step` (0 = the
/// first generated token) of a request with `seed`: 53 bits of
/// splitmix64(splitmix64(seed) + step).
double sampling_uniform(uint64_t seed, int64_t step);

/// The host reference of the definition above (double sums over a sort of
/// the kept tokens): the token picked from logits (n_vocab floats) with `sp`
/// and uniform `u`. NaN logits are never picked.
int32_t sample_reference(const float* logits, int n_vocab, const SamplingParams& sp, double u);

}  // namespace ratekv::engine
