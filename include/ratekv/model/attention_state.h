// ratekv/model/attention_state.h — the pieces of causal softmax attention the
// CPU caches share (DenseKVCache, the packed cache): which cached tokens a
// query sees, the logit of a dot product, and the online-softmax state of one
// query row with merge() (split-K / flash-decoding style; docs/design.md §6).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/model/kv_cache.h"

namespace ratekv {

/// Index range [lo, hi) of the cached tokens a query at position p sees:
/// positions kpos strictly increasing, so the range is contiguous; window > 0
/// keeps keys at positions > p − window (sliding-window layers).
inline void key_range(const std::vector<int32_t>& kpos, int32_t p, int64_t window, int64_t& lo, int64_t& hi) {
  hi = std::upper_bound(kpos.begin(), kpos.end(), p) - kpos.begin();
  lo = 0;
  if (window > 0) {
    const int64_t first = static_cast<int64_t>(p) - window + 1;
    lo = std::lower_bound(kpos.begin(), kpos.end(), first, [](int32_t a, int64_t b) { return a < b; }) -
         kpos.begin();
  }
}

/// The arguments every cache's attend() checks first: layer in
/// [0, n_layers), n > 0 queries, a positive finite logit scale. Throws Error
/// prefixed by `who` (e.g. "DenseKVCache::attend").
inline void check_attend_args(const char* who, int layer, int n_layers, int64_t n, const AttnParams& p) {
  check(layer >= 0 && layer < n_layers, "{}: layer {} out of range [0, {})", who, layer, n_layers);
  check(n > 0, "{}: n = {} must be positive", who, n);
  check(p.scale > 0 && std::isfinite(p.scale), "{}: scale {} must be finite and positive", who, p.scale);
}

/// key_range of each of the n queries at positions pos over the cached
/// positions kpos of `layer`: lo, hi (n). Throws Error prefixed by `who` when
/// a query sees no cached key (attention needs its token appended first).
inline void query_key_ranges(const char* who, int layer, const std::vector<int32_t>& kpos, int64_t n,
                             const int32_t* pos, int64_t window, std::vector<int64_t>& lo, std::vector<int64_t>& hi) {
  lo.resize(n);
  hi.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    key_range(kpos, pos[i], window, lo[i], hi[i]);
    check(hi[i] > lo[i], "{}: layer {}: query at position {} sees no cached key (append first)", who, layer, pos[i]);
  }
}

/// The attention logit of a raw dot product q·k: scale·dot, soft-capped as
/// softcap·tanh(x/softcap) when p.softcap > 0.
inline float attention_logit(float dot, const AttnParams& p) {
  float x = dot * p.scale;
  if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
  return x;
}

/// The online-softmax state of one query row over a subset of the keys:
/// m = the largest logit seen, l = Σ_t e^{s_t − m}. The caller holds the
/// unnormalized output o = Σ_t e^{s_t − m} v_t beside it (any number of
/// floats: several value domains may sit side by side); the row's attention
/// output is o / l once every key is in. An empty state has m = −∞, l = 0.
struct SoftmaxState {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;

  /// Raises the running max to mx (≥ m) and returns the factor e^{m_old − mx}
  /// by which l was rescaled and the caller must rescale its o (0 for an
  /// empty state, 1 when mx == m).
  float raise_max(float mx) {
    if (mx == m) return 1.0f;
    const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m - mx);
    l *= alpha;
    m = mx;
    return alpha;
  }

  /// Merges the state b of a disjoint subset of the keys (its output o_b)
  /// into this one and its output o; o, o_b: len floats (log-sum-exp
  /// rescaling of both to the larger max).
  void merge(const SoftmaxState& b, float* o, const float* o_b, int len) {
    if (b.m == -std::numeric_limits<float>::infinity()) return;
    if (m == -std::numeric_limits<float>::infinity()) {
      *this = b;
      std::copy(o_b, o_b + len, o);
      return;
    }
    const float mx = std::max(m, b.m);
    const float fa = std::exp(m - mx), fb = std::exp(b.m - mx);
    for (int i = 0; i < len; ++i) o[i] = o[i] * fa + o_b[i] * fb;
    l = l * fa + b.l * fb;
    m = mx;
  }
};

}  // namespace ratekv
