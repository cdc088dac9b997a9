// ref::fp16_decode_attention against the fp32 DenseKVCache (model/kv_cache.h)
// on the same fp16 K/V rows: with the power-of-two scale 1/8 the kernel's
// query rounding fp16(scale · q) equals scale · fp16(q) exactly, so the dense
// cache attending with fp16(q) and scale 1/8 computes the same attention (in
// fp32). Pages scattered by a shuffled page table; lengths 1, 64, 65, 97, 200,
// unequal in a batch; GQA 1/3/4/7/8; head_dim 64/128/256.
#include <gtest/gtest.h>

#include <cmath>
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

TEST(RefFp16Decode, EqualsDenseCacheOnFp16Rows) {
  struct C {
    int d, hkv, gqa;
    std::vector<int> lens;
  };
  const C cases[] = {{64, 3, 8, {1, 97, 200}}, {128, 2, 3, {200, 1, 64, 65}}, {256, 1, 1, {97}},
                     {64, 1, 7, {130, 3}},      {128, 2, 4, {97}}};
  const float scale = 0.125f;
  uint32_t seed = 7;
  for (const C& c : cases) {
    SCOPED_TRACE("d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " gqa=" + std::to_string(c.gqa));
    std::mt19937 rng(seed++);
    const TestBatch B = make_batch(c.lens, rng);
    const int hq = c.hkv * c.gqa, nb = (int)c.lens.size();
    const size_t page_elems = (size_t)c.hkv * 2 * kPageTokens * c.d;
    std::normal_distribution<float> N;
    std::vector<uint16_t> pool((size_t)B.n_pages * page_elems);
    for (auto& x : pool) x = fp32_to_fp16(N(rng) + 0.3f);
    std::vector<float> q((size_t)nb * hq * c.d);
    for (auto& x : q) x = 3.f * N(rng);
    const std::vector<float> out = ref::fp16_decode_attention(hq, c.hkv, c.d, B.ref(), pool, q, scale);
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
      dense.attend(0, 1, &pos.back(), q16.data(), want.data(), ap);
      std::vector<float> got(out.begin() + (size_t)b * hq * c.d, out.begin() + (size_t)(b + 1) * hq * c.d);
      EXPECT_LT(rel_err(got, want, 0, got.size()), 2e-6) << "sequence " << b << " (length " << T << ")";
    }
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
}
