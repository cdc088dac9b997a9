// ref::fp16_decode_attention against the fp32 DenseKVCache (model/kv_cache.h)
// on the same fp16 K/V rows: with the power-of-two scale 1/8 the kernel's
// query rounding fp16(scale · q) equals scale · fp16(q) exactly, so the dense
// cache attending with fp16(q) and scale 1/8 computes the same attention (in
// fp32). Pages scattered by a shuffled page table; lengths 1, 64, 65, 97, 200,
// unequal in a batch; GQA 1/3/4/7/8; head_dim 64/128/256; and with sliding
// windows (ref::DecodeBatch::window) against the dense cache's
// AttnParams::sliding_window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <numeric>
#include <random>

#include "../support/packed_plans.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/model/kv_cache.h"
#include "ratekv/ref/fp16_decode_attention.h"

using namespace ratekv;
using namespace ratekv_test;
using packed::kPageTokens;

namespace {

struct C {
  int d, hkv, gqa;
  std::vector<int> lens;
};

// Runs every case of `cases` with the sliding window `window` (0: none) in
// the reference and in the dense cache (AttnParams::sliding_window, the CPU
// runtime's definition); returns the largest relative error of the windowed
// reference against the UNWINDOWED one over the sequences whose window cuts
// keys (length > window), or 0 without such a sequence.
double compare_with_dense(const std::vector<C>& cases, int window, uint32_t seed, float q_amp = 3.f) {
  const float scale = 0.125f;
  double cut_min = INFINITY;
  for (const C& c : cases) {
    SCOPED_TRACE("d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " gqa=" + std::to_string(c.gqa) +
                 " window " + std::to_string(window));
    std::mt19937 rng(seed++);
    const TestBatch B = make_batch(c.lens, rng);
    const int hq = c.hkv * c.gqa, nb = (int)c.lens.size();
    const size_t page_elems = (size_t)c.hkv * 2 * kPageTokens * c.d;
    std::normal_distribution<float> N;
    std::vector<uint16_t> pool((size_t)B.n_pages * page_elems);
    for (auto& x : pool) x = fp32_to_fp16(N(rng) + 0.3f);
    std::vector<float> q((size_t)nb * hq * c.d);
    for (auto& x : q) x = q_amp * N(rng);
    ref::DecodeBatch rb = B.ref();
    rb.window = window;
    const std::vector<float> out = ref::fp16_decode_attention(hq, c.hkv, c.d, rb, pool, q, scale);
    const std::vector<float> full = ref::fp16_decode_attention(hq, c.hkv, c.d, B.ref(), pool, q, scale);
    for (int b = 0; b < nb; ++b) {
      const int T = c.lens[b];
      DenseKVCache dense(KVCacheShape{1, hq, c.hkv, c.d, T});
      std::vector<float> K((size_t)T * c.hkv * c.d), V(K.size());
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < c.hkv; ++h)
          for (int s = 0; s < 2; ++s) {
            const uint16_t* row = pool.data() + (size_t)B.page_table[(size_t)b * B.max_pages + t / kPageTokens] * page_elems +
                                  ((size_t)h * 2 + s) * kPageTokens * c.d + (size_t)(t % kPageTokens) * c.d;
            for (int i = 0; i < c.d; ++i) (s == 0 ? K : V)[((size_t)t * c.hkv + h) * c.d + i] = fp16_to_fp32(row[i]);
          }
      std::vector<int32_t> pos(T);
      std::iota(pos.begin(), pos.end(), 0);
      dense.append(0, T, pos.data(), K.data(), K.data(), V.data());
      std::vector<float> q16(q.begin() + (size_t)b * hq * c.d, q.begin() + (size_t)(b + 1) * hq * c.d);
      for (float& x : q16) x = round_fp16(x);
      std::vector<float> want(q16.size());
      AttnParams ap;
      ap.scale = scale;
      ap.sliding_window = window;
      dense.attend(0, 1, &pos.back(), q16.data(), want.data(), ap);
      std::vector<float> got(out.begin() + (size_t)b * hq * c.d, out.begin() + (size_t)(b + 1) * hq * c.d);
      EXPECT_LT(rel_err(got, want, 0, got.size()), 2e-6) << "sequence " << b << " (length " << T << ")";
      if (window > 0 && T > window) cut_min = std::min(cut_min, rel_err(out, full, (size_t)b * hq * c.d, (size_t)hq * c.d));
      if (window == 0 || T <= window) {  // the window holds every key: bit-identical to no window
        EXPECT_TRUE(std::equal(got.begin(), got.end(), full.begin() + (size_t)b * hq * c.d)) << "sequence " << b;
      }
    }
  }
  return std::isinf(cut_min) ? 0.0 : cut_min;
}

}  // namespace

TEST(RefFp16Decode, EqualsDenseCacheOnFp16Rows) {
  const std::vector<C> cases = {{64, 3, 8, {1, 97, 200}}, {128, 2, 3, {200, 1, 64, 65}}, {256, 1, 1, {97}},
                                {64, 1, 7, {130, 3}},      {128, 2, 4, {97}}};
  compare_with_dense(cases, 0, 7);
}

// ref::DecodeBatch::window against the CPU runtime's sliding window
// (DenseKVCache with AttnParams::sliding_window = W: a query at p sees keys
// p − W < t ≤ p): W ∈ {1, 15, 16, 17, 48, 100} and lengths whose window start
// T − W falls on, before and after a 16-token tile and a 64-page boundary.
// Where the window cuts keys (T > W) the result must differ from the
// unwindowed reference (a reference that ignored the window would fail):
// queries N(0, 1) (scores ~N(0, 1): the cut keys keep a visible weight).
TEST(RefFp16Decode, SlidingWindowEqualsDenseCache) {
  const std::vector<C> cases = {{64, 2, 4, {1, 16, 17, 97, 130, 300}}, {128, 1, 8, {300, 65, 64, 33}},
                                {256, 1, 1, {116, 49}}};
  uint32_t seed = 60;
  for (const int W : {1, 15, 16, 17, 48, 100}) {
    const double cut = compare_with_dense(cases, W, seed, 1.f);
    seed += 3;
    // 50x the agreement with the dense cache (2e-6): every cut sequence moved.
    EXPECT_GT(cut, 1e-4) << "window " << W << ": the windowed reference barely differs from the unwindowed one";
  }
}

TEST(RefFp16Decode, BadInputsAreErrors) {
  std::mt19937 rng(1);
  const TestBatch B = make_batch({5}, rng);
  const std::vector<uint16_t> pool((size_t)B.n_pages * 2 * 2 * kPageTokens * 64, fp32_to_fp16(0.5f));
  const std::vector<float> q(4 * 64, 1.f);
  EXPECT_NO_THROW(ref::fp16_decode_attention(4, 2, 64, B.ref(), pool, q, 0.125f));
  EXPECT_THROW(ref::fp16_decode_attention(3, 2, 64, B.ref(), pool, q, 0.125f), Error);  // GQA 1.5
  EXPECT_THROW(ref::fp16_decode_attention(4, 2, 64, B.ref(), std::span<const uint16_t>(pool).first(pool.size() - 2), q,
                                          0.125f),
               Error);  // not whole pages
  EXPECT_THROW(ref::fp16_decode_attention(4, 2, 64, B.ref(), pool, std::span<const float>(q).first(64), 0.125f), Error);
  const std::vector<int32_t> bad_table = {B.n_pages};
  EXPECT_THROW(ref::fp16_decode_attention(4, 2, 64, {bad_table, 1, B.lens}, pool, q, 0.125f), Error);
  ref::DecodeBatch neg = B.ref();
  neg.window = -1;
  try {
    ref::fp16_decode_attention(4, 2, 64, neg, pool, q, 0.125f);
    ADD_FAILURE() << "window -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window -1 must be >= 0"), std::string::npos) << e.what();
  }
}
