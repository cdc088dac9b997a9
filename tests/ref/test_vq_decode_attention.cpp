// ref::vq_decode_attention against the CPU packed cache's attention
// (PackedKVCache::attend, fp32) over the same vq pages: one CPU cache per
// sequence quantizes the keys (pre-RoPE, shared fp16 scale, channel weights)
// and values, its vq pages (and scalar pages for TQ-MSE values) are copied
// into a shuffled pool, and the reference over that pool must reproduce
// attend() for the last position. The cache decodes with the codec and
// ratekv::apply_rope; the reference with the plan's codeword tables and its
// own RoPE. Lengths 1, 97, 200 (unequal in a batch); GQA 1/3/4/7/8; head_dim
// 64/128/256; keys g 4/8 with 5..10-bit indices; values CQ, fp16, TQ-MSE;
// interleaved and NeoX RoPE.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "../support/packed_cache_plans.h"
#include "../support/packed_plans.h"
#include "../support/vq_plans.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/ref/vq_decode_attention.h"

using namespace ratekv;
using namespace ratekv::cache;
using namespace ratekv_test;

namespace {

struct Case {
  int d, hkv, gqa;
  std::vector<int> lens;
  int g, kbits, vbits;
  VqValues values;
  RopeLayout rope;
};

// (T, H, d) data with per-channel scales and an offset (never zeros).
std::vector<float> kv_data(int64_t T, int H, int d, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * H * d);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < d; ++c) x[(t * H + h) * d + c] = (0.2f + 2.8f * ((c * 7 + h) % d) / d) * nd(rng) + 0.3f;
  return x;
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE("d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " gqa=" + std::to_string(c.gqa) +
               " g=" + std::to_string(c.g) + " kbits=" + std::to_string(c.kbits) +
               (c.values == VqValues::vq ? " V vq" : c.values == VqValues::fp16 ? " V fp16" : " V tq-mse") +
               (c.rope == RopeLayout::NeoX ? " neox" : " interleaved"));
  std::mt19937 rng(seed);
  const ModelConfig cfg = vq_config(c.d, c.hkv, c.gqa, c.rope);
  auto codecs = vq_codecs(cfg, c.g, c.kbits, c.vbits, c.values, seed + 1);
  const int nb = (int)c.lens.size(), hq = c.hkv * c.gqa, d = c.d;
  const TestBatch B = make_batch(c.lens, rng);
  std::vector<std::unique_ptr<PackedKVCache>> caches;
  std::vector<float> q((size_t)nb * hq * d), want(q.size());
  std::normal_distribution<float> nq(0.0f, 1.5f);
  for (auto& x : q) x = nq(rng);
  AttnParams ap;
  ap.scale = 1.0f / std::sqrt((float)d);
  for (int b = 0; b < nb; ++b) {
    const int T = c.lens[b];
    auto cache = std::make_unique<PackedKVCache>(cfg.kv_shape(T), codecs);
    std::vector<int32_t> pos(T);
    std::iota(pos.begin(), pos.end(), 0);
    const auto Kp = kv_data(T, c.hkv, d, rng), V = kv_data(T, c.hkv, d, rng);
    std::vector<float> K = Kp;
    for (int t = 0; t < T; ++t)
      apply_rope(K.data() + (size_t)t * c.hkv * d, c.hkv, d, t, cfg.rope_layout, cfg.rope_theta);
    cache->append(0, T, pos.data(), Kp.data(), K.data(), V.data());
    ASSERT_EQ(cache->n_quantized(0), T);
    cache->attend(0, 1, &pos.back(), q.data() + (size_t)b * hq * d, want.data() + (size_t)b * hq * d, ap);
    caches.push_back(std::move(cache));
  }
  const packed::VqLayerLayout& L = *caches[0]->vq_layout(0);
  std::vector<uint8_t> pool((size_t)B.n_pages * L.page_bytes()), spool;
  for (auto& x : pool) x = (uint8_t)rng();  // pages no sequence uses: never read
  for (int b = 0; b < nb; ++b)
    pool = scatter_pages([&](int i) { return caches[b]->vq_page(0, i); }, (c.lens[b] + 63) / 64,
                         std::span<const int32_t>(B.page_table).subspan((size_t)b * B.max_pages), B.n_pages,
                         L.page_bytes(), pool);
  std::unique_ptr<ref::PackedPlan> splan;
  if (c.values == VqValues::tq_mse) {
    splan = std::make_unique<ref::PackedPlan>(cache_ref_plan(*caches[0], 0));
    const size_t spb = caches[0]->layout(0).page_bytes();
    spool.resize((size_t)B.n_pages * spb);
    for (int b = 0; b < nb; ++b)
      spool = scatter_pages([&](int i) { return caches[b]->page(0, i); }, (c.lens[b] + 63) / 64,
                            std::span<const int32_t>(B.page_table).subspan((size_t)b * B.max_pages), B.n_pages, spb,
                            spool);
  }
  const VqTables tab = vq_tables(*codecs);
  const ref::VqPlan plan(L, hq, tab.codewords, tab.channels, ref::VqRope{c.rope == RopeLayout::NeoX, cfg.rope_theta},
                         splan.get());
  const std::vector<float> out = ref::vq_decode_attention(plan, B.ref(), pool, spool, q, ap.scale);
  for (int b = 0; b < nb; ++b) {
    const size_t n = (size_t)hq * d;
    const double e = rel_err(out, want, b * n, n);
    EXPECT_LT(e, 1e-5) << "sequence " << b << " (length " << c.lens[b] << ")";
    std::printf("  seq %d len %d: rel err %.2e\n", b, c.lens[b], e);
  }
}

}  // namespace

TEST(RefVqDecode, EqualsCpuPackedCacheAttention) {
  const Case cases[] = {
      {64, 3, 3, {1, 97, 200}, 8, 10, 6, VqValues::vq, RopeLayout::Interleaved},
      {64, 3, 1, {200}, 4, 5, 5, VqValues::fp16, RopeLayout::Interleaved},
      {128, 2, 4, {97, 200, 1}, 8, 7, 5, VqValues::vq, RopeLayout::NeoX},
      {128, 1, 8, {1, 65}, 8, 9, 5, VqValues::fp16, RopeLayout::NeoX},
      {64, 2, 7, {200, 1, 97}, 4, 5, 4, VqValues::fp16, RopeLayout::NeoX},
      {64, 3, 3, {97, 200, 1}, 8, 6, 3, VqValues::tq_mse, RopeLayout::Interleaved},
      {128, 2, 1, {130}, 8, 8, 2, VqValues::tq_mse, RopeLayout::NeoX},
      {256, 1, 4, {97, 2}, 8, 6, 4, VqValues::vq, RopeLayout::NeoX},
  };
  uint32_t seed = 900;
  for (const Case& c : cases) run_case(c, seed += 10);
}

TEST(RefVqDecode, BadPlansAreErrors) {
  const packed::VqLayerLayout L(64, 1, {packed::VqSideKind::vq, 8, 4, true}, {packed::VqSideKind::fp16, 0, 0, false});
  std::vector<float> cw(8 * 16 * 8, 0.5f);
  std::vector<int32_t> ch(64);
  std::iota(ch.begin(), ch.end(), 0);
  const ref::VqRope rope{};
  EXPECT_NO_THROW(ref::VqPlan(L, 2, cw, ch, rope));
  std::vector<int32_t> dup = ch;
  dup[5] = 4;  // channel 4 twice
  EXPECT_THROW(ref::VqPlan(L, 2, cw, dup, rope), Error);
  EXPECT_THROW(ref::VqPlan(L, 2, std::span<const float>(cw).first(cw.size() - 1), ch, rope), Error);
  std::vector<float> nan_cw = cw;
  nan_cw[3] = NAN;
  EXPECT_THROW(ref::VqPlan(L, 2, nan_cw, ch, rope), Error);
  EXPECT_THROW(ref::VqPlan(L, 0, cw, ch, rope), Error);
  EXPECT_THROW(ref::VqPlan(L, 2, cw, ch, ref::VqRope{false, -1.0}), Error);
  // A value side outside the vq pages (scalar TQ-MSE) needs its PackedPlan.
  const packed::VqLayerLayout Lk(64, 1, {packed::VqSideKind::vq, 8, 4, true}, {});
  EXPECT_THROW(ref::VqPlan(Lk, 2, cw, ch, rope), Error);
  // Attention inputs: q size, pool of partial pages, a page id past the pool.
  const ref::VqPlan plan(L, 2, cw, ch, rope);
  const std::vector<uint8_t> pool(L.page_bytes(), 0);
  const std::vector<int32_t> table = {0}, lens = {5}, bad_table = {1};
  const std::vector<float> q(2 * 64, 1.f);
  EXPECT_NO_THROW(ref::vq_decode_attention(plan, {table, 1, lens}, pool, {}, q, 0.125f));
  EXPECT_THROW(ref::vq_decode_attention(plan, {table, 1, lens}, pool, {}, std::span<const float>(q).first(64), 0.125f),
               Error);
  EXPECT_THROW(ref::vq_decode_attention(plan, {table, 1, lens}, std::span<const uint8_t>(pool).first(16), {}, q, 0.125f),
               Error);
  EXPECT_THROW(ref::vq_decode_attention(plan, {bad_table, 1, lens}, pool, {}, q, 0.125f), Error);
}
