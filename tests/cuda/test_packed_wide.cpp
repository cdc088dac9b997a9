// CUDA writer / reader of plans with 5..8-bit groups (cuda::packed_write_wide,
// cuda::packed_dequantize_wide, ratekv/cuda/packed_wide.h) against the
// reference: ref::tq_mse_encode's codes (double) written by the format's
// reference writer (packed::write_codes / write_norm: the low nibble into the
// layer's pages, the high bits into the extension pages, as the CPU packed
// cache stores them, docs/packed_format.md §5), over the same random pools
// under a shuffled page table. Every code equals the reference's except
// within 1e-5 of a midpoint (the kernel sums Π x in fp32) and then by one
// level; the fp16 norms agree to 1e-3; the GPU's codes and norms are then
// copied into the reference pools, which must
// equal the GPU's byte for byte (bit placement, norms, untouched bytes). The
// reconstructions against x̂ = n·Πᵀ c[code] in double (2⁻¹⁰ relative: one
// fp16 rounding). Shapes: head_dim 64 (3 KV heads) and 128 (2 KV heads),
// widths 2..8 per head and side, prefill of 97 tokens after 0 and 63 cached,
// decode appends after 1 and 130. Needs a GPU: skips when none is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "../support/cuda_test.h"
#include "../support/packed_cache_plans.h"
#include "../support/tiny_model.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cuda/packed_wide.h"
#include "ratekv/ref/packed_plan.h"
#include "ratekv/ref/packed_quantize.h"

using namespace ratekv;
using namespace ratekv_test;
using packed::LayerLayout;
using packed::Side;

namespace {

struct Case {
  int d, hkv;
  std::vector<int> kbits, vbits;  // per KV head
  std::vector<int> starts;        // tokens cached per sequence before the write
  int n_tokens;
};

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE("d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " n_tokens=" + std::to_string(c.n_tokens));
  std::mt19937 rng(seed);
  const ModelConfig cfg = tiny_config({.n_layers = 1, .n_heads = c.hkv * 2, .n_kv_heads = c.hkv, .head_dim = c.d,
                                       .n_ctx = 1 << 20, .rope_theta = 1e4},
                                      RopeLayout::Interleaved);
  Plan p;
  p.method = "ratequant";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.layers.assign(1, std::vector<HeadPlan>(c.hkv));
  for (int h = 0; h < c.hkv; ++h) {
    p.layers[0][h].key = Codec::tq_mse(c.kbits[h], c.d, seed + 3 * h);
    p.layers[0][h].value = Codec::tq_mse(c.vbits[h], c.d, seed + 3 * h + 1);
  }
  auto codecs = std::make_shared<const cache::PlanCodecs>(p, cfg);
  const cache::PackedKVCache cpu(cfg.kv_shape(64), codecs);  // its layouts and quantizers
  const LayerLayout& L = cpu.layout(0);
  ASSERT_NE(cpu.ext_layout(0), nullptr);
  const LayerLayout& E = *cpu.ext_layout(0);
  std::vector<float> rot, lvl;
  for (int h = 0; h < c.hkv; ++h)
    for (int s = 0; s < 2; ++s)
      for (const quant::TQMSE* tq : layout_quantizers(cpu, 0, h, s)) {
        const auto M = tq->rotation().matrix();
        for (int i = 0; i < tq->dim(); ++i)
          for (int j = 0; j < tq->dim(); ++j) rot.push_back((float)M(i, j));
        lvl.insert(lvl.end(), tq->codebook().levels.begin(), tq->codebook().levels.end());
      }
  const cuda::PackedPlan plan(L, E, cfg.n_heads, rot, lvl);
  const ref::PackedPlan rplan(L, E, cfg.n_heads, rot, lvl);
  const int nb = (int)c.starts.size(), n = c.n_tokens, d = c.d, H = c.hkv;
  const int max_len = *std::max_element(c.starts.begin(), c.starts.end()) + n;
  const int max_pages = (max_len + 63) / 64;
  std::vector<int32_t> table((size_t)nb * max_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const size_t pb = L.page_bytes(), eb = E.page_bytes();
  std::vector<uint8_t> pool(table.size() * pb), ext(table.size() * eb);
  for (auto& x : pool) x = (uint8_t)rng();
  for (auto& x : ext) x = (uint8_t)rng();
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k((size_t)nb * n * H * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = (0.5f + (i % d) / (float)d) * nd(rng) + 0.2f, v[i] = 1.5f * nd(rng);
  DevBuf<uint8_t> dpool(pool), dext(ext);
  DevBuf<int32_t> dpt(table), dlen(std::vector<int32_t>(c.starts.begin(), c.starts.end()));
  DevBuf<float> dk(k), dv(v);
  cuda::DecodeBatch db{dpt.p, max_pages, dlen.p, nb, max_len};
  cuda::packed_write_wide(plan, db, dpool.p, dext.p, dk.p, dv.p, n, nullptr);
  CK(cudaDeviceSynchronize());
  const std::vector<uint8_t> gpool = dpool.get(), gext = dext.get();
  auto page = [&](std::vector<uint8_t>& P, size_t bytes, int id) { return std::span<uint8_t>(P.data() + id * bytes, bytes); };
  auto cpage = [&](const std::vector<uint8_t>& P, size_t bytes, int id) {
    return std::span<const uint8_t>(P.data() + id * bytes, bytes);
  };
  int flips = 0, coords = 0;
  for (int b = 0; b < nb; ++b)
    for (int i = 0; i < n; ++i) {
      const int pos = c.starts[b] + i, id = table[(size_t)b * max_pages + pos / 64], slot = pos % 64;
      for (int h = 0; h < H; ++h)
        for (int s = 0; s < 2; ++s) {
          const Side side = s == 0 ? Side::key : Side::value;
          const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
          int e = 0;  // index among the side's wide groups
          for (int g = 0; g < (int)specs.size(); ++g) {
            const int m = (int)specs[g].channels.size();
            const float* x = (s == 0 ? k : v).data() + (((size_t)b * n + i) * H + h) * d;
            std::vector<float> xg(m);
            for (int j = 0; j < m; ++j) xg[j] = x[specs[g].channels[j]];
            const ref::TqMseCode rc = ref::tq_mse_encode(rplan.rotation(h, side, g), rplan.levels(h, side, g), xg);
            const bool wide = rplan.levels(h, side, g).size() > 16;
            std::vector<uint8_t> lo(m), hi(m, 0), got(m);
            read_codes(L, cpage(gpool, pb, id), h, side, g, slot, lo);
            if (wide) read_codes(E, cpage(gext, eb, id), h, side, e, slot, hi);
            for (int j = 0; j < m; ++j) {
              got[j] = (uint8_t)(lo[j] | (hi[j] << 4));
              ++coords;
              if (got[j] != rc.codes[j]) {
                ++flips;
                EXPECT_LT(rc.margin[j], 1e-5) << "b " << b << " token " << i << " h " << h << " s " << s << " j " << j;
                EXPECT_EQ(std::abs((int)got[j] - (int)rc.codes[j]), 1);
              }
              lo[j] = got[j] & 0xF;
              hi[j] = got[j] >> 4;
            }
            write_codes(L, page(pool, pb, id), h, side, g, slot, lo);
            if (wide) write_codes(E, page(ext, eb, id), h, side, e++, slot, hi);
            // fp16(‖x‖): the GPU sums in fp32, the reference in double (one fp16 ulp apart at most).
            const uint16_t gn = read_norm(L, cpage(gpool, pb, id), h, side, g, slot);
            EXPECT_NEAR(fp16_to_fp32(gn), fp16_to_fp32(rc.norm_fp16), 1e-3 * fp16_to_fp32(rc.norm_fp16));
            write_norm(L, page(pool, pb, id), h, side, g, slot, gn);
          }
        }
    }
  std::printf("  %d of %d codes one level off at a midpoint\n", flips, coords);
  EXPECT_LT(flips, coords / 1000 + 1);
  EXPECT_TRUE(pool == gpool) << "main pages differ outside the written codes";
  EXPECT_TRUE(ext == gext) << "extension pages differ outside the written codes";
  // Reconstructions of sequence 0's tokens 0 .. starts[0] + n − 1 (those written here).
  if (c.starts[0] != 0) return;
  DevBuf<uint16_t> k16((size_t)n * H * d), v16((size_t)n * H * d);
  cuda::packed_dequantize_wide(plan, dpool.p, dext.p, dpt.p, n, k16.p, v16.p, nullptr);
  CK(cudaDeviceSynchronize());
  const auto gk = k16.get(), gv = v16.get();
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const int id = table[i / 64], slot = i % 64;
    for (int h = 0; h < H; ++h)
      for (int s = 0; s < 2; ++s) {
        const Side side = s == 0 ? Side::key : Side::value;
        const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
        std::vector<double> xh(d, 0.0);
        int e = 0;
        for (int g = 0; g < (int)specs.size(); ++g) {
          const int m = (int)specs[g].channels.size();
          const bool wide = rplan.levels(h, side, g).size() > 16;
          std::vector<uint8_t> lo(m), hi(m, 0);
          read_codes(L, cpage(gpool, pb, id), h, side, g, slot, lo);
          if (wide) read_codes(E, cpage(gext, eb, id), h, side, e++, slot, hi);
          const double nrm = fp16_to_fp32(read_norm(L, cpage(gpool, pb, id), h, side, g, slot));
          const auto R = rplan.rotation(h, side, g);
          const auto lv = rplan.levels(h, side, g);
          for (int q = 0; q < m; ++q) {
            double a = 0;
            for (int j = 0; j < m; ++j) a += (double)R[(size_t)j * m + q] * lv[lo[j] | (hi[j] << 4)];
            xh[specs[g].channels[q]] = nrm * a;
          }
        }
        const auto& out = s == 0 ? gk : gv;
        for (int ch = 0; ch < d; ++ch) {
          const double g = fp16_to_fp32(out[((size_t)i * H + h) * d + ch]);
          bad += !(std::abs(g - xh[ch]) <= std::ldexp(std::abs(xh[ch]), -10) + 1e-5);
        }
      }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace

TEST(CudaPackedWide, WriteAndDequantizeMatchTheReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_case({64, 3, {5, 3, 8}, {6, 2, 4}, {0, 63}, 97}, 11);   // prefill
  run_case({128, 2, {6, 7}, {5, 8}, {0, 5}, 130}, 12);        // prefill, 2 pages + 2 tokens
  run_case({64, 3, {8, 5, 2}, {3, 7, 6}, {1, 130}, 1}, 13);   // decode append
}

TEST(CudaPackedWide, RefusesPlansWithoutWideGroups) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const ModelConfig cfg = tiny_config({.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 64, .n_ctx = 4096,
                                       .rope_theta = 1e4},
                                      RopeLayout::Interleaved);
  Plan p;
  p.method = "uniform";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.layers.assign(1, std::vector<HeadPlan>(1, HeadPlan{Codec::tq_mse(3, 64, 1), Codec::tq_mse(3, 64, 2)}));
  auto codecs = std::make_shared<const cache::PlanCodecs>(p, cfg);
  const cache::PackedKVCache cpu(cfg.kv_shape(64), codecs);
  std::vector<float> rot, lvl;
  for (int s = 0; s < 2; ++s)
    for (const quant::TQMSE* tq : layout_quantizers(cpu, 0, 0, s)) {
      const auto M = tq->rotation().matrix();
      for (int i = 0; i < 64; ++i)
        for (int j = 0; j < 64; ++j) rot.push_back((float)M(i, j));
      lvl.insert(lvl.end(), tq->codebook().levels.begin(), tq->codebook().levels.end());
    }
  const cuda::PackedPlan plan(cpu.layout(0), 2, rot, lvl);
  DevBuf<int32_t> pt(std::vector<int32_t>{0}), len(std::vector<int32_t>{0});
  DevBuf<uint8_t> pool(cpu.layout(0).page_bytes());
  DevBuf<float> x(64);
  DevBuf<uint16_t> o(64);
  cuda::DecodeBatch db{pt.p, 1, len.p, 1, 1};
  EXPECT_THROW(cuda::packed_write_wide(plan, db, pool.p, pool.p, x.p, x.p, 1, nullptr), Error);
  EXPECT_THROW(cuda::packed_dequantize_wide(plan, pool.p, pool.p, pt.p, 1, o.p, o.p, nullptr), Error);
}
