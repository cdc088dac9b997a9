// CUDA encoder of the vq pages (cuda::vq_append, ratekv/cuda/vq_encode.h)
// against the scalar reference encoder cache::encode_vq_token /
// cache::vq_token_scale and the format's reference writer
// (packed::write_fp16_row): both start from the same pool of random bytes
// under a shuffled page table; the reference encodes every written token into
// its copy, the GPU into its own, and the two pools must be equal byte for
// byte (indices, shared scales, fp16 rows, and every byte the writers must not
// touch: other tokens' bits, padding, unused pages). Shapes: prefill of 1, 97
// and 130 tokens appended after 0, 5 and 63 cached tokens (not a multiple of a
// page), decode appends of one token to sequences of unequal lengths; head_dim
// 64/128/256, 1/2/3/8 KV heads, groups of 2/4/8/16 channels, 1..12-bit indices
// (indices that straddle bytes and 32-bit words), shared scale and channel
// weights on the keys, CQ / fp16 / scalar (untouched) values, and exact
// distance ties (duplicated codewords: the lower index wins). Needs a GPU:
// skips when none is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "../support/cuda_test.h"
#include "../support/packed_cache_plans.h"
#include "../support/vq_plans.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/vq_page_codec.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cuda/vq_encode.h"
#include "ratekv/format/packed_vq_format.h"

using namespace ratekv;
using namespace ratekv_test;

namespace {

struct Case {
  int d, hkv, g, kbits, vbits;
  VqValues values;
  std::vector<int> before;  // cached tokens per sequence before the write
  int n_tokens;             // tokens written per sequence
  int dup_every = 0;
};

// (n, H, d) data with per-channel scales and an offset (never zeros).
std::vector<float> data(int64_t n, int H, int d, std::mt19937& rng, float amp) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x((size_t)n * H * d);
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < d; ++c)
        x[((size_t)t * H + h) * d + c] = amp * ((0.2f + 2.8f * ((c * 7 + h) % d) / d) * nd(rng) + 0.3f);
  return x;
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE("d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " g=" + std::to_string(c.g) +
               " kbits=" + std::to_string(c.kbits) + " n_tokens=" + std::to_string(c.n_tokens) +
               (c.values == VqValues::vq ? " V vq" : c.values == VqValues::fp16 ? " V fp16" : " V tq-mse"));
  std::mt19937 rng(seed);
  const ModelConfig cfg = vq_config(c.d, c.hkv, 1, RopeLayout::NeoX);
  auto codecs = vq_codecs(cfg, c.g, c.kbits, c.vbits, c.values, seed + 1, c.dup_every);
  const int d = c.d, H = c.hkv, nb = (int)c.before.size(), n = c.n_tokens;
  using packed::Side;
  using packed::VqSideKind;
  const packed::VqSideSpec kspec{VqSideKind::vq, d / c.g, c.kbits, true};
  const packed::VqSideSpec vspec = c.values == VqValues::vq     ? packed::VqSideSpec{VqSideKind::vq, d / 8, c.vbits, false}
                                   : c.values == VqValues::fp16 ? packed::VqSideSpec{VqSideKind::fp16, 0, 0, false}
                                                                : packed::VqSideSpec{};
  const packed::VqLayerLayout L(d, H, kspec, vspec);
  const int max_len = *std::max_element(c.before.begin(), c.before.end()) + n;
  const int max_pages = (max_len + 63) / 64;
  std::vector<int32_t> table((size_t)nb * max_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const size_t pb = L.page_bytes();
  std::vector<uint8_t> pool(table.size() * pb);
  for (auto& x : pool) x = (uint8_t)rng();
  // Keys over a range of magnitudes (scales from ~1e-3 to ~1e2), values too.
  std::vector<float> kpre, k, v;
  for (int b = 0; b < nb; ++b) {
    const float amp = std::pow(10.0f, -3.0f + 5.0f * b / std::max(1, nb - 1));
    auto kb = data(n, H, d, rng, amp), kr = data(n, H, d, rng, 1.0f), vb = data(n, H, d, rng, 1.0f);
    kpre.insert(kpre.end(), kb.begin(), kb.end());
    k.insert(k.end(), kr.begin(), kr.end());  // fp16 keys would read these (not in these plans)
    v.insert(v.end(), vb.begin(), vb.end());
  }
  // The reference: encode_vq_token / write_fp16_row into a copy of the pool.
  std::vector<uint8_t> want = pool;
  std::vector<const cache::VqCodec*> kh(H), vh(H);
  for (int h = 0; h < H; ++h) {
    kh[h] = codecs->vq(0, h, cache::KVSide::key);
    vh[h] = codecs->vq(0, h, cache::KVSide::value);
  }
  const size_t row = (size_t)H * d;
  for (int b = 0; b < nb; ++b)
    for (int i = 0; i < n; ++i) {
      const int pos = c.before[b] + i;
      std::span<uint8_t> page(want.data() + (size_t)table[(size_t)b * max_pages + pos / 64] * pb, pb);
      const size_t at = ((size_t)b * n + i) * row;
      cache::encode_vq_token(L, page, Side::key, pos % 64, kh, kpre.data() + at,
                             cache::vq_token_scale(kh, kpre.data() + at));
      if (c.values == VqValues::vq)
        cache::encode_vq_token(L, page, Side::value, pos % 64, vh, v.data() + at, 1.0f);
      if (c.values == VqValues::fp16)
        for (int h = 0; h < H; ++h) {
          std::vector<uint16_t> r(d);
          for (int ch = 0; ch < d; ++ch) r[ch] = fp32_to_fp16(v[at + (size_t)h * d + ch]);
          packed::write_fp16_row(L, page, h, Side::value, pos % 64, r);
        }
    }
  const VqEncodeTables tab = vq_encode_tables(*codecs);
  const cuda::VqEncodePlan plan(L, tab.codebooks, tab.channel_scale, tab.channels);
  // What it allocated = the closed form the GPU engine's memory plan counts.
  EXPECT_EQ(plan.device_bytes(), cuda::vq_encode_plan_device_bytes(L.n_kv_heads(), L.head_dim(), tab.codebooks.size()));
  DevBuf<uint8_t> dpool(pool);
  DevBuf<int32_t> dpt(table), dlen(std::vector<int32_t>(c.before.begin(), c.before.end()));
  DevBuf<float> dkpre(kpre), dk(k), dv(v);
  cuda::DecodeBatch db{dpt.p, max_pages, dlen.p, nb, max_len};
  cuda::vq_append(plan, db, dpool.p, dkpre.p, dk.p, dv.p, n, nullptr);
  EXPECT_NO_THROW(cuda::vq_check_status(plan, nullptr, "test"));
  CK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = dpool.get();
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && diff++ == 0) first = i;
  EXPECT_EQ(diff, 0u) << "bytes differ; first at page " << first / pb << " byte " << first % pb;
  // The pools did change (the comparison is not of two untouched copies).
  EXPECT_NE(want, pool);
}

}  // namespace

TEST(CudaVqEncode, PrefillMatchesReferenceEncoder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  for (const Case& c : std::vector<Case>{
           {64, 3, 8, 10, 6, VqValues::vq, {0, 5, 63}, 97},      // SmolLM2-like TaSQ g8 K1024, CQ values
           {64, 3, 4, 5, 4, VqValues::fp16, {0}, 1},             // length 1
           {128, 8, 8, 12, 5, VqValues::tq_mse, {0, 63}, 130},   // 12-bit indices straddle words; scalar V untouched
           {128, 1, 16, 7, 3, VqValues::vq, {5}, 97},            // odd G·bits: tokens share bytes
           {256, 2, 2, 9, 8, VqValues::fp16, {0, 64}, 130},      // g 2, head_dim 256
           {64, 2, 8, 1, 1, VqValues::vq, {3, 0}, 97},           // 1-bit indices
       })
    run_case(c, seed++);
}

TEST(CudaVqEncode, DecodeAppendMatchesReferenceEncoder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 200;
  for (const Case& c : std::vector<Case>{
           {64, 3, 8, 10, 6, VqValues::vq, {0, 1, 63, 64, 96, 200, 1000}, 1},
           {128, 8, 4, 6, 4, VqValues::tq_mse, {97, 5, 130}, 1},
           {256, 1, 8, 8, 4, VqValues::fp16, {1, 127}, 1},
       })
    run_case(c, seed++);
}

TEST(CudaVqEncode, TiesPickTheLowestIndex) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Every other codeword duplicated: half of the nearest codewords have an
  // exact twin one index up; the reference keeps the lower one.
  run_case({64, 3, 8, 6, 5, VqValues::vq, {0, 17}, 97, 2}, 300);
  run_case({128, 2, 4, 3, 3, VqValues::fp16, {0}, 130, 2}, 301);
}

TEST(CudaVqEncode, BadPlansAndArguments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using packed::VqSideKind;
  const packed::VqLayerLayout L(64, 2, {VqSideKind::vq, 8, 4, true}, {});
  std::vector<float> cb((size_t)2 * 8 * 16 * 8, 0.5f), a(2 * 64, 1.0f);
  std::vector<int32_t> ch(2 * 64);
  for (size_t i = 0; i < ch.size(); ++i) ch[i] = (int32_t)(i % 64);
  EXPECT_NO_THROW(cuda::VqEncodePlan(L, cb, a, ch));
  EXPECT_THROW(cuda::VqEncodePlan(L, std::span<const float>(cb).first(cb.size() - 1), a, ch), Error);
  auto bad_a = a;
  bad_a[3] = 0.0f;
  EXPECT_THROW(cuda::VqEncodePlan(L, cb, bad_a, ch), Error);
  auto bad_ch = ch;
  bad_ch[1] = 0;  // channel 0 twice
  EXPECT_THROW(cuda::VqEncodePlan(L, cb, a, bad_ch), Error);
  const cuda::VqEncodePlan plan(L, cb, a, ch);
  DevBuf<int32_t> pt(std::vector<int32_t>{0}), len(std::vector<int32_t>{0});
  DevBuf<uint8_t> pool(L.page_bytes());
  DevBuf<float> x(128);
  cuda::DecodeBatch db{pt.p, 1, len.p, 1, 1};
  EXPECT_THROW(cuda::vq_append(plan, db, pool.p, x.p, nullptr, nullptr, 0, nullptr), Error);
  EXPECT_THROW(cuda::vq_append(plan, db, pool.p, nullptr, x.p, nullptr, 1, nullptr), Error);  // vq keys read k_pre
  // A key whose weighted RMS overflows fp16: flagged, reported by vq_check_status.
  std::vector<float> big(128, 1e6f);
  DevBuf<float> dbig(big);
  cuda::vq_append(plan, db, pool.p, dbig.p, nullptr, nullptr, 1, nullptr);
  EXPECT_THROW(cuda::vq_check_status(plan, nullptr, "test"), Error);
  EXPECT_NO_THROW(cuda::vq_check_status(plan, nullptr, "test"));  // cleared
}

// cuda::vq_dequantize (evaluation / chunked prefill's K/V) against the
// reference decoder cache::decode_vq_token + apply_rope at the token's
// position (keys) over pages the CPU packed cache wrote; tokens read from a
// page-table row that starts at logical page 1 (positions 64 …), 97 tokens.
// fp32 on both sides, rounded to fp16 once: within 2⁻¹⁰ relative (the RoPE's
// fp32 operation order may differ) of the reference.
TEST(CudaVqEncode, DequantizeMatchesReferenceDecoder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const VqValues vals : {VqValues::vq, VqValues::fp16, VqValues::tq_mse})
    for (const RopeLayout rope : {RopeLayout::Interleaved, RopeLayout::NeoX}) {
      std::mt19937 rng(400 + (int)vals);
      const int d = rope == RopeLayout::NeoX ? 128 : 64, H = rope == RopeLayout::NeoX ? 2 : 3, T = 64 + 97;
      const ModelConfig cfg = vq_config(d, H, 2, rope);
      auto codecs = vq_codecs(cfg, 8, 7, 4, vals, 401);  // 4-bit TQ-MSE values: no extension pages
      cache::PackedKVCache cache(cfg.kv_shape(T), codecs);
      std::vector<int32_t> pos(T);
      std::iota(pos.begin(), pos.end(), 0);
      auto Kp = data(T, H, d, rng, 1.0f), V = data(T, H, d, rng, 1.0f);
      std::vector<float> K = Kp;
      for (int t = 0; t < T; ++t) apply_rope(K.data() + (size_t)t * H * d, H, d, t, cfg.rope_layout, cfg.rope_theta);
      cache.append(0, T, pos.data(), Kp.data(), K.data(), V.data());
      const packed::VqLayerLayout* L = cache.vq_layout(0);
      ASSERT_NE(L, nullptr);
      const int n_pages = (T + 63) / 64;
      std::vector<int32_t> table(n_pages);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      const size_t pb = L->page_bytes();
      std::vector<uint8_t> pool((size_t)n_pages * pb);
      for (int i = 0; i < n_pages; ++i) {
        const auto pg = cache.vq_page(0, i);
        std::copy(pg.begin(), pg.end(), pool.begin() + (size_t)table[i] * pb);
      }
      std::unique_ptr<cuda::PackedPlan> splan;
      if (vals == VqValues::tq_mse) {
        std::vector<float> rot, lvl;
        for (int h = 0; h < H; ++h) {
          const quant::TQMSE* tq = layout_quantizers(cache, 0, h, 1).at(0);
          const auto M = tq->rotation().matrix();
          for (int i = 0; i < d; ++i)
            for (int j = 0; j < d; ++j) rot.push_back((float)M(i, j));
          lvl.insert(lvl.end(), tq->codebook().levels.begin(), tq->codebook().levels.end());
        }
        splan = std::make_unique<cuda::PackedPlan>(cache.layout(0), H * 2, rot, lvl);
      }
      const VqTables tab = vq_tables(*codecs);
      const cuda::VqPlan plan(*L, H * 2, tab.codewords, tab.channels,
                              cuda::VqRope{rope == RopeLayout::NeoX, cfg.rope_theta}, splan.get());
      const int n = 97, pos0 = 64;
      DevBuf<uint8_t> dpool(pool);
      DevBuf<int32_t> dpt(std::vector<int32_t>(table.begin() + 1, table.end()));
      DevBuf<uint16_t> k16((size_t)n * H * d), v16((size_t)n * H * d);
      CK(cudaMemset(v16.p, 0x3c, v16.n * 2));  // scalar values: must stay untouched
      cuda::vq_dequantize(plan, dpool.p, dpt.p, n, pos0, k16.p, v16.p, nullptr);
      CK(cudaDeviceSynchronize());
      const auto gk = k16.get(), gv = v16.get();
      std::vector<const cache::VqCodec*> kh(H), vh(H);
      for (int h = 0; h < H; ++h) {
        kh[h] = codecs->vq(0, h, cache::KVSide::key);
        vh[h] = codecs->vq(0, h, cache::KVSide::value);
      }
      int bad = 0;
      std::vector<float> xk((size_t)H * d), xv((size_t)H * d);
      for (int i = 0; i < n; ++i) {
        const int t = pos0 + i;
        const auto page = cache.vq_page(0, t / 64);
        cache::decode_vq_token(*L, page, packed::Side::key, t % 64, kh, xk.data());
        apply_rope(xk.data(), H, d, t, cfg.rope_layout, cfg.rope_theta);
        if (vals == VqValues::vq) cache::decode_vq_token(*L, page, packed::Side::value, t % 64, vh, xv.data());
        if (vals == VqValues::fp16) {
          std::vector<uint16_t> r(d);
          for (int h = 0; h < H; ++h) {
            packed::read_fp16_row(*L, page, h, packed::Side::value, t % 64, r);
            for (int c = 0; c < d; ++c) xv[(size_t)h * d + c] = fp16_to_fp32(r[c]);
          }
        }
        for (size_t e = 0; e < xk.size(); ++e) {
          const float g = fp16_to_fp32(gk[(size_t)i * H * d + e]);
          bad += !(std::abs(g - xk[e]) <= std::ldexp(std::abs(xk[e]), -10) + 1e-6f);
          const float w = vals == VqValues::tq_mse ? fp16_to_fp32(0x3c3c) : xv[e];
          const float gvv = fp16_to_fp32(gv[(size_t)i * H * d + e]);
          bad += !(std::abs(gvv - w) <= std::ldexp(std::abs(w), -10) + 1e-6f);
        }
      }
      EXPECT_EQ(bad, 0) << "values " << (int)vals << " rope " << (int)rope;
    }
}
