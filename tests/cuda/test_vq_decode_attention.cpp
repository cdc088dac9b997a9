// CUDA decode attention over the vq pages (TaSQ / CQ plans, codec kind vq,
// docs/packed_format.md §7) against its named CPU reference,
// ref::vq_decode_attention (tested on the CPU in tests/ref against the CPU
// packed cache's attention): the CPU PackedKVCache writes the pages (keys
// pre-RoPE, shared scale, channel weights; values CQ, fp16 or scalar TQ-MSE),
// they are copied into a shuffled GPU page pool, and the kernel must
// reproduce the reference over the same pool (rel err < 1e-3; the kernel
// computes in fp32, the reference in double). Needs a GPU: skips when none is
// visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "../support/cuda_test.h"
#include "../support/packed_cache_plans.h"
#include "../support/packed_plans.h"
#include "../support/vq_plans.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/format/packed_vq_format.h"
#include "ratekv/ref/vq_decode_attention.h"

using namespace ratekv;
using namespace ratekv::cache;
using namespace ratekv_test;
using ratekv::cuda::DType;

namespace {

// (T, H, d) data with per-channel scales and an offset (never zeros).
std::vector<float> kv_data(int64_t T, int H, int d, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * H * d);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < d; ++c) x[(t * H + h) * d + c] = (0.2f + 2.8f * ((c * 7 + h) % d) / d) * nd(rng) + 0.3f;
  return x;
}

struct Case {
  int d, hkv, gqa;
  std::vector<int> lens;
  int g, kbits, vbits;
  VqValues values;
  RopeLayout rope;
  DType q_dtype;
};

void run_case(const Case& c, uint32_t seed) {
  const std::string nm = "d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " gqa=" +
                         std::to_string(c.gqa) + " g=" + std::to_string(c.g) + " kbits=" + std::to_string(c.kbits) +
                         (c.values == VqValues::vq ? " V vq" : c.values == VqValues::fp16 ? " V fp16" : " V tq-mse") +
                         (c.rope == RopeLayout::NeoX ? " neox" : " interleaved");
  SCOPED_TRACE(nm);
  std::mt19937 rng(seed);
  const ModelConfig cfg = vq_config(c.d, c.hkv, c.gqa, c.rope);
  auto codecs = vq_codecs(cfg, c.g, c.kbits, c.vbits, c.values, seed + 1);
  const int nb = (int)c.lens.size(), hq = c.hkv * c.gqa, d = c.d;
  const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
  const int max_pages = (max_len + packed::kPageTokens - 1) / packed::kPageTokens;
  // One CPU packed cache per sequence writes its pages; positions = token index.
  std::vector<std::unique_ptr<PackedKVCache>> caches;
  std::vector<float> q((size_t)nb * hq * d);
  std::normal_distribution<float> nq(0.0f, 1.5f);
  for (auto& x : q) x = nq(rng);
  const std::vector<uint16_t> q16 = fp16_queries(q, c.q_dtype);
  const float scale = 1.0f / std::sqrt((float)d);
  for (int b = 0; b < nb; ++b) {
    const int T = c.lens[b];
    auto cache = std::make_unique<PackedKVCache>(cfg.kv_shape(T), codecs);
    std::vector<int32_t> pos(T);
    std::iota(pos.begin(), pos.end(), 0);
    const auto Kp = kv_data(T, c.hkv, d, rng), V = kv_data(T, c.hkv, d, rng);
    std::vector<float> K = Kp;
    for (int t = 0; t < T; ++t) apply_rope(K.data() + (size_t)t * c.hkv * d, c.hkv, d, t, cfg.rope_layout, cfg.rope_theta);
    cache->append(0, T, pos.data(), Kp.data(), K.data(), V.data());
    ASSERT_EQ(cache->n_quantized(0), T);
    caches.push_back(std::move(cache));
  }
  const packed::VqLayerLayout* L = caches[0]->vq_layout(0);
  ASSERT_NE(L, nullptr);
  ASSERT_EQ(L->side(packed::Side::key).kind, packed::VqSideKind::vq);
  // GPU pool: every sequence owns max_pages shuffled physical pages; unused
  // pages hold random bytes (never read).
  const size_t pb = L->page_bytes();
  std::vector<int32_t> table((size_t)nb * max_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const int n_pages = (int)table.size();
  std::vector<uint8_t> pool(table.size() * pb);
  for (auto& x : pool) x = (uint8_t)rng();
  for (int b = 0; b < nb; ++b)
    pool = scatter_pages([&](int i) { return caches[b]->vq_page(0, i); }, (c.lens[b] + 63) / 64,
                         std::span<const int32_t>(table).subspan((size_t)b * max_pages), n_pages, pb, pool);
  // Scalar TQ-MSE values: the CPU cache's scalar pages (same page table) and
  // the plan of its layout with the quantizers' rotations and levels.
  std::unique_ptr<ref::PackedPlan> rsplan;
  std::unique_ptr<cuda::PackedPlan> splan;
  std::vector<uint8_t> spool;
  if (c.values == VqValues::tq_mse) {
    const packed::LayerLayout& SL = caches[0]->layout(0);
    std::vector<float> rot, lvl;
    for (int h = 0; h < c.hkv; ++h) {
      ASSERT_TRUE(SL.head(h).key.empty());
      ASSERT_EQ(SL.head(h).value.size(), 1u);
      const quant::TQMSE* tq = layout_quantizers(*caches[0], 0, h, 1).at(0);
      const auto M = tq->rotation().matrix();  // y = Π x, channels in the group's order
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) rot.push_back((float)M(i, j));
      lvl.insert(lvl.end(), tq->codebook().levels.begin(), tq->codebook().levels.end());
    }
    splan = std::make_unique<cuda::PackedPlan>(SL, hq, rot, lvl);
    rsplan = std::make_unique<ref::PackedPlan>(SL, hq, rot, lvl);
    const size_t spb = SL.page_bytes();
    spool.resize(table.size() * spb);
    for (auto& x : spool) x = (uint8_t)rng();
    for (int b = 0; b < nb; ++b)
      spool = scatter_pages([&](int i) { return caches[b]->page(0, i); }, (c.lens[b] + 63) / 64,
                            std::span<const int32_t>(table).subspan((size_t)b * max_pages), n_pages, spb, spool);
  }
  const VqTables tab = vq_tables(*codecs);
  const cuda::VqPlan plan(*L, hq, tab.codewords, tab.channels,
                          cuda::VqRope{cfg.rope_layout == RopeLayout::NeoX, cfg.rope_theta}, splan.get());
  // What it allocated = the closed form the GPU engine's memory plan counts.
  EXPECT_EQ(plan.device_bytes(), cuda::vq_plan_device_bytes(L->n_kv_heads(), L->head_dim(), tab.codewords.size(),
                                                            tab.channels.size()));
  const ref::VqPlan rplan(*L, hq, tab.codewords, tab.channels,
                          ref::VqRope{cfg.rope_layout == RopeLayout::NeoX, cfg.rope_theta}, rsplan.get());
  const std::vector<int32_t> lens(c.lens.begin(), c.lens.end());
  const std::vector<float> reference =
      ref::vq_decode_attention(rplan, {table, max_pages, lens}, pool, spool, q, scale);
  DevBuf<uint8_t> dpool(pool), dspool(spool);
  DevBuf<int32_t> dpt(table), dlen(lens);
  DevBuf<float> dq(q), dout(q.size());
  DevBuf<uint16_t> dq16(q16);
  CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
  const int splits = cuda::default_splits(plan, nb, max_len);
  const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, d, splits);
  DevBuf<uint8_t> ws(ws_bytes);
  cuda::DecodeBatch db{dpt.p, max_pages, dlen.p, nb, max_len};
  cuda::vq_decode_attention(plan, db, dpool.p, splan ? dspool.p : nullptr,
                            c.q_dtype == DType::f16 ? (void*)dq16.p : dq.p, c.q_dtype, scale, dout.p, ws.p, ws_bytes,
                            splits, nullptr);
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  const auto out = dout.get();
  for (int b = 0; b < nb; ++b) {
    const size_t n = (size_t)hq * d;
    const double e = rel_err(out, reference, (size_t)b * n, n);
    EXPECT_LT(e, 1e-3) << "sequence " << b << " (length " << c.lens[b] << ")";
    std::printf("  %s seq %d len %d: rel err %.2e\n", nm.c_str(), b, c.lens[b], e);
  }
}

}  // namespace

// Small case (also the compute-sanitizer case).
TEST(CudaVqDecode, Small) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_case({64, 3, 3, {1, 97, 130}, 8, 6, 5, VqValues::vq, RopeLayout::Interleaved, DType::f32}, 21);
  run_case({64, 2, 2, {130, 1}, 4, 10, 3, VqValues::tq_mse, RopeLayout::NeoX, DType::f16}, 22);
}

// Lengths 1, 97, 4096; batch 1 and 3; GQA 1, 3, 4; TaSQ keys g 4/8 with
// 5..10-bit indices (10 bits: indices straddle bytes), values CQ, fp16 or
// TQ-MSE; interleaved and NeoX RoPE; head_dim 64/128.
TEST(CudaVqDecode, AgainstNamedReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {64, 3, 3, {1, 97, 4096}, 8, 10, 6, VqValues::vq, RopeLayout::Interleaved, DType::f32},
      {64, 3, 1, {4096}, 4, 5, 5, VqValues::fp16, RopeLayout::Interleaved, DType::f32},
      {128, 2, 4, {97, 4096, 1}, 8, 7, 5, VqValues::vq, RopeLayout::NeoX, DType::f16},
      {128, 1, 4, {1}, 8, 9, 5, VqValues::fp16, RopeLayout::NeoX, DType::f32},
      {64, 3, 4, {4096, 1, 97}, 4, 5, 4, VqValues::fp16, RopeLayout::NeoX, DType::f16},
      {64, 3, 3, {97, 4096, 1}, 8, 6, 3, VqValues::tq_mse, RopeLayout::Interleaved, DType::f32},
      {128, 2, 1, {4096}, 8, 8, 2, VqValues::tq_mse, RopeLayout::NeoX, DType::f32},
  };
  uint32_t seed = 900;
  for (const Case& c : cases) run_case(c, seed += 10);
}

TEST(CudaVqDecode, RejectsBadPlans) {
  const packed::VqLayerLayout L(64, 1, {packed::VqSideKind::vq, 8, 4, true}, {packed::VqSideKind::fp16, 0, 0, false});
  std::vector<float> cw(8 * 16 * 8, 0.5f);
  std::vector<int32_t> ch(64);
  std::iota(ch.begin(), ch.end(), 0);
  const cuda::VqRope rope{};
  if (have_gpu()) {
    EXPECT_NO_THROW(cuda::VqPlan(L, 2, cw, ch, rope));
  }
  std::vector<int32_t> dup = ch;
  dup[5] = 4;  // channel 4 twice
  EXPECT_THROW(cuda::VqPlan(L, 2, cw, dup, rope), ratekv::Error);
  std::vector<float> short_cw(cw.begin(), cw.end() - 1);
  EXPECT_THROW(cuda::VqPlan(L, 2, short_cw, ch, rope), ratekv::Error);
  std::vector<float> nan_cw = cw;
  nan_cw[3] = NAN;
  EXPECT_THROW(cuda::VqPlan(L, 2, nan_cw, ch, rope), ratekv::Error);
  EXPECT_THROW(cuda::VqPlan(L, 17, cw, ch, rope), ratekv::Error);  // GQA 17
  EXPECT_THROW(cuda::VqPlan(L, 2, cw, ch, cuda::VqRope{false, -1.0}), ratekv::Error);
  // A value side outside the vq pages (scalar TQ-MSE) needs its PackedPlan.
  const packed::VqLayerLayout Lk(64, 1, {packed::VqSideKind::vq, 8, 4, true}, {});
  EXPECT_THROW(cuda::VqPlan(Lk, 2, cw, ch, rope), ratekv::Error);
}
