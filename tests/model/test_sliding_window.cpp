// The sliding-window arithmetic (ratekv/model/sliding_window.h) the GPU
// engine's kernels and tiling use, against brute force over the definition
// (a query at p sees keys p − W < t ≤ p) and against the CPU runtime's
// DenseKVCache, which implements AttnParams::sliding_window independently.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ratekv/model/kv_cache.h"
#include "ratekv/model/sliding_window.h"

namespace {

using namespace ratekv;

TEST(SlidingWindow, FirstVisibleKeyIsTheDefinition) {
  for (int64_t w = 0; w <= 70; ++w)
    for (int64_t p = 0; p < 200; ++p) {
      int64_t first = -1;
      for (int64_t t = 0; t <= p && first < 0; ++t)
        if (w == 0 || t > p - w) first = t;
      ASSERT_EQ(first_visible_key(p, w), first) << "p " << p << " window " << w;
    }
}

// Decode attention's split partition: units (pages of 64 or tiles of 16) from
// the one holding the first visible key to the last one holding a token fit in
// ⌈span/unit⌉ units, for every length up to max_len; without a window the
// span is max_len.
TEST(SlidingWindow, DecodeSpanCoversTheWindowsUnits) {
  for (int64_t unit : {16, 64})
    for (int64_t w : {1, 15, 16, 17, 48, 63, 64, 65, 127, 200, 512})
      for (int64_t extra : {0, 1, 37, 300})
        for (int64_t len = 1; len <= 700; ++len) {
          const int64_t max_len = len + extra;
          const int64_t span = window_span_tokens(max_len, w, unit);
          const int64_t first_unit = first_visible_key(len - 1, w) / unit, end_unit = (len + unit - 1) / unit;
          ASSERT_LE(end_unit - first_unit, (span + unit - 1) / unit)
              << "unit " << unit << " window " << w << " len " << len << " max_len " << max_len;
          ASSERT_LE(span, max_len);
        }
  EXPECT_EQ(window_span_tokens(1000, 0, 64), 1000);
  EXPECT_EQ(window_span_tokens(1000, 48, 64), 176);  // 48 + 2·64
  EXPECT_EQ(window_span_tokens(100, 48, 64), 100);
}

// Chunked prefill's first key tile: a page-aligned position at or before the
// first visible key of every query of the chunk, less than a page before the
// first query's.
TEST(SlidingWindow, ChunkFirstKeyIsPageAligned) {
  for (int64_t w : {0, 1, 48, 64, 100, 512})
    for (int64_t q0 = 0; q0 < 800; q0 += 7) {
      const int64_t k = window_first_key_aligned(q0, w, 64);
      EXPECT_EQ(k % 64, 0);
      EXPECT_LE(k, first_visible_key(q0, w));
      EXPECT_GT(k + 64, first_visible_key(q0, w));
      for (int64_t q = q0; q < q0 + 130; ++q) EXPECT_LE(k, first_visible_key(q, w));
      if (w == 0) {
        EXPECT_EQ(k, 0);
      }
    }
}

// The CPU runtime's window (DenseKVCache::attend with AttnParams::sliding_window)
// is the one first_visible_key describes: one-hot values reveal which keys a
// query's softmax weighs (equal keys: uniform weights over the visible ones).
TEST(SlidingWindow, MatchesTheCpuRuntimesWindow) {
  const int n = 90, w = 17;
  KVCacheShape s;
  s.n_layers = 1;
  s.n_heads = 1;
  s.n_kv_heads = 1;
  s.head_dim = n;  // value t = e_t: the output is the attention weights
  s.n_ctx = n;
  DenseKVCache cache(s);
  std::vector<float> k(size_t(n) * n, 0.f), v(size_t(n) * n, 0.f), q(size_t(n) * n, 0.f), out(size_t(n) * n);
  std::vector<int32_t> pos(n);
  for (int t = 0; t < n; ++t) {
    pos[t] = t;
    k[size_t(t) * n] = 1.f;  // every key the same: equal scores
    v[size_t(t) * n + t] = 1.f;
    q[size_t(t) * n] = 1.f;
  }
  cache.append(0, n, pos.data(), k.data(), k.data(), v.data());
  AttnParams ap;
  ap.scale = 1.f;
  ap.sliding_window = w;
  cache.attend(0, n, pos.data(), q.data(), out.data(), ap);
  for (int p = 0; p < n; ++p) {
    const int64_t first = first_visible_key(p, w);
    const float expect = 1.f / static_cast<float>(p - first + 1);
    for (int t = 0; t < n; ++t)
      ASSERT_NEAR(out[size_t(p) * n + t], t >= first && t <= p ? expect : 0.f, 1e-6f) << "query " << p << " key " << t;
  }
}

}  // namespace
