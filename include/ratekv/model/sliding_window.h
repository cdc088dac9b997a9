// ratekv/model/sliding_window.h — the arithmetic of sliding-window attention
// (Gemma 3's local layers) shared by the CPU runtime's definition and the GPU
// engine's kernels and tiling: which keys a query sees, and which pages /
// tiles of a paged cache a window touches.
//
// Definition (model/kv_cache.h, AttnParams::sliding_window): with a window of
// W > 0 tokens, a query at position p attends to the keys at positions
// p − W < t ≤ p, i.e. first_visible_key(p, W) ≤ t ≤ p; W = 0 is full causal
// attention (every t ≤ p).
#pragma once

#include <algorithm>
#include <cstdint>

namespace ratekv {

/// The first key position a query at position `pos` (≥ 0) attends to with a
/// window of `window` tokens (0 = no window): max(0, pos − window + 1), or 0.
constexpr int64_t first_visible_key(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

/// Tokens a split-K partition of decode attention must cover when sequences
/// of up to `max_len` cached tokens are read in whole units (pages or tiles)
/// of `unit` tokens starting at the unit that holds the first visible key of
/// the query at position len − 1: max_len without a window, else
/// min(max_len, window + 2·unit) — the window's tokens plus at most unit − 1
/// before it in its first unit and unit − 1 after the end in the last one.
/// Every unit index u with first_visible_key(len − 1, window)/unit ≤ u <
/// ⌈len/unit⌉ is then below first + ⌈span/unit⌉ (tests/model/test_sliding_window.cpp).
constexpr int64_t window_span_tokens(int64_t max_len, int64_t window, int64_t unit) {
  return window > 0 ? std::min<int64_t>(max_len, window + 2 * unit) : max_len;
}

/// The first key position a chunk of queries at positions q0 .. q0+n−1
/// attends to (the first query's first visible key), rounded down to a
/// multiple of `unit` (the page, for key tiles read from pages).
constexpr int64_t window_first_key_aligned(int64_t q0, int64_t window, int64_t unit) {
  return first_visible_key(q0, window) / unit * unit;
}

}  // namespace ratekv
