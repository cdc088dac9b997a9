// The quantizer references (ref::tq_mse_encode, ref::packed_append,
// ref::packed_prefill): closed-form codes and norms on hand-made vectors, and
// pages written by the references equal, code for code and norm for norm, the
// pages the CPU packed cache writes with its own quantizer (quant::TQMSE,
// fp32 rotation of x/‖x‖, binary search over its thresholds) for the same
// data — up to codes where y lies within 1e-5 of a midpoint — while bytes of
// tokens not written stay as they were. Uniform and Block-GTQ-style grouped
// plans; head_dim 64/128/256; lengths 1, 2, 97, 200 in one batch (prefill
// chunks that start inside and cross pages, appends at unequal positions).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "../support/packed_cache_plans.h"
#include "../support/packed_plans.h"
#include "../support/tiny_model.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/ref/packed_quantize.h"

using namespace ratekv;
using namespace ratekv::packed;
using namespace ratekv_test;

TEST(RefTqMseEncode, ClosedFormCodesNormsAndMargins) {
  // Levels ±1/4, ±3/4: midpoints −1/2, 0, 1/2. ‖x‖ = 1, so y = Π x.
  const std::vector<float> lv = {-0.75f, -0.25f, 0.25f, 0.75f};
  const std::vector<float> x = {-0.9f, -0.3f, 0.1f, 0.3f};
  std::vector<float> id(16, 0.f);
  for (int i = 0; i < 4; ++i) id[i * 5] = 1.f;
  ref::TqMseCode c = ref::tq_mse_encode(id, lv, x);
  EXPECT_EQ(c.codes, (std::vector<uint8_t>{0, 1, 2, 2}));
  EXPECT_EQ(c.norm_fp16, fp32_to_fp16(1.0f));
  const double want_margin[] = {0.4, 0.2, 0.1, 0.2};
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(c.margin[j], want_margin[j], 1e-6);
  // Π = a signed permutation: y = (−x₂, x₀, x₃, −x₁), norm scales out.
  std::vector<float> P(16, 0.f);
  P[0 * 4 + 2] = -1.f;
  P[1 * 4 + 0] = 1.f;
  P[2 * 4 + 3] = 1.f;
  P[3 * 4 + 1] = -1.f;
  const std::vector<float> x3 = {-2.7f, -0.9f, 0.3f, 0.9f};  // 3·x, ‖x3‖ = 3
  c = ref::tq_mse_encode(P, lv, x3);
  EXPECT_EQ(c.codes, (std::vector<uint8_t>{1, 0, 2, 2}));  // y = (−0.1, −0.9, 0.3, 0.3)
  EXPECT_EQ(c.norm_fp16, fp32_to_fp16(3.0f));
  // The zero vector: y = 0, code = #{midpoints < 0} = 1, norm 0.
  c = ref::tq_mse_encode(P, lv, std::vector<float>(4, 0.f));
  EXPECT_EQ(c.codes, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(c.norm_fp16, 0);
  EXPECT_THROW(ref::tq_mse_encode(P, std::vector<float>(3, 0.f), x), Error);  // not 2^b levels
  EXPECT_THROW(ref::tq_mse_encode(std::span<const float>(P).first(15), lv, x), Error);
  EXPECT_THROW(ref::tq_mse_encode(P, lv, std::vector<float>{1.f, NAN, 0.f, 0.f}), Error);
}

namespace {

// A llama-shaped config (no weights), GQA 2: only the cache shape matters here.
ModelConfig config(int head_dim, int n_kv_heads) {
  return ratekv_test::tiny_config({.n_layers = 1,
                                   .n_heads = n_kv_heads * 2,
                                   .n_kv_heads = n_kv_heads,
                                   .head_dim = head_dim,
                                   .n_ctx = 8192,
                                   .rope_theta = 10000.0});
}

// grouped: keys of three widths (blocks 3i → 4 bits, 3i+1 → 2, 3i+2 → 3; the
// last block at 0 bits), values 1..4 bits by head; else uniform K3V2.
std::shared_ptr<const cache::PlanCodecs> codecs_for(const ModelConfig& cfg, bool grouped) {
  Plan p;
  p.method = "test";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.layers.assign(1, std::vector<HeadPlan>(cfg.n_kv_heads));
  for (int h = 0; h < cfg.n_kv_heads; ++h) {
    HeadPlan& hp = p.layers[0][h];
    hp.key = Codec::tq_mse(3, cfg.head_dim, 100 + h);
    hp.value = Codec::tq_mse(grouped ? 1 + h % 4 : 2, cfg.head_dim, 200 + h);
    if (grouped) {
      Codec c;
      c.kind = CodecKind::TqMseGrouped;
      c.norm = NormStorage::FP16;
      CodecGroup g[4];
      const int bits[4] = {4, 2, 3, 0};
      for (int i = 0; i < 4; ++i) {
        g[i].bits = bits[i];
        g[i].seed = 300 + 10 * h + i;
      }
      const int nb = cfg.head_dim / 2;
      for (int b = 0; b < nb - 1; ++b) g[b % 3].blocks.push_back(b);
      g[3].blocks.push_back(nb - 1);
      c.groups.assign(g, g + 4);
      hp.key = c;
    }
  }
  return std::make_shared<cache::PlanCodecs>(p, cfg, "test-plan");
}

void run_case(int d, int hkv, bool grouped, uint32_t seed) {
  SCOPED_TRACE("d=" + std::to_string(d) + " hkv=" + std::to_string(hkv) + (grouped ? " grouped" : " uniform"));
  std::mt19937 rng(seed);
  const ModelConfig cfg = config(d, hkv);
  auto codecs = codecs_for(cfg, grouped);
  const std::vector<int> lens = {200, 1, 97, 2};
  const int nb = (int)lens.size();
  const TestBatch B = make_batch(lens, rng);
  std::normal_distribution<float> N;
  std::vector<std::vector<float>> K(nb), V(nb);  // (T, hkv, d) per sequence
  std::vector<std::unique_ptr<cache::PackedKVCache>> caches;
  cache::PackedCacheOptions po;
  po.fp16_window = 0;
  po.sink_tokens = 0;
  for (int b = 0; b < nb; ++b) {
    const int T = lens[b];
    K[b].resize((size_t)T * hkv * d);
    V[b].resize(K[b].size());
    for (size_t i = 0; i < K[b].size(); ++i) {
      K[b][i] = (0.2f + 2.8f * (i % d) / d) * N(rng) + 0.3f;
      V[b][i] = N(rng);
    }
    caches.push_back(std::make_unique<cache::PackedKVCache>(cfg.kv_shape(T), codecs, po));
    std::vector<int32_t> pos(T);
    std::iota(pos.begin(), pos.end(), 0);
    caches[b]->append(0, T, pos.data(), K[b].data(), K[b].data(), V[b].data());
  }
  const ref::PackedPlan plan = cache_ref_plan(*caches[0], 0);
  const LayerLayout& L = plan.layout();
  std::vector<uint8_t> pool((size_t)B.n_pages * L.page_bytes());
  for (auto& x : pool) x = (uint8_t)rng();
  const std::vector<uint8_t> before = pool;
  const size_t row = (size_t)hkv * d;
  // 1. token 0 of every sequence: one batched prefill of 1 token.
  {
    std::vector<float> k(nb * row), v(nb * row);
    for (int b = 0; b < nb; ++b) {
      std::copy_n(K[b].data(), row, k.data() + b * row);
      std::copy_n(V[b].data(), row, v.data() + b * row);
    }
    const std::vector<int32_t> zero(nb, 0);
    ref::packed_prefill(plan, {B.page_table, B.max_pages, zero}, pool, k, v, 1);
  }
  // 2. tokens 1 .. T−2 of each longer sequence: one prefill chunk each (starts
  //    in page 0 and crosses pages for T = 200).
  for (int b = 0; b < nb; ++b) {
    if (lens[b] <= 2) continue;
    const std::vector<int32_t> one = {1};
    ref::packed_prefill(plan, {std::span<const int32_t>(B.page_table).subspan((size_t)b * B.max_pages, B.max_pages),
                               B.max_pages, one},
                        pool, std::span<const float>(K[b]).subspan(row, (lens[b] - 2) * row),
                        std::span<const float>(V[b]).subspan(row, (lens[b] - 2) * row), lens[b] - 2);
  }
  // 3. the last token of every sequence of ≥ 2 tokens: one append at unequal
  //    positions (sequence 1, length 1, is given its own page row but not appended).
  {
    std::vector<int32_t> table, at;
    std::vector<float> k, v;
    for (int b = 0; b < nb; ++b) {
      if (lens[b] < 2) continue;
      table.insert(table.end(), B.page_table.begin() + (size_t)b * B.max_pages,
                   B.page_table.begin() + (size_t)(b + 1) * B.max_pages);
      at.push_back(lens[b] - 1);
      k.insert(k.end(), K[b].end() - row, K[b].end());
      v.insert(v.end(), V[b].end() - row, V[b].end());
    }
    ref::packed_append(plan, {table, B.max_pages, at}, pool, k, v);
  }
  // Codes and norms of every written token equal the cache's; the bytes of
  // every other slot are unchanged.
  int ties = 0, norm_ulps = 0, codes_checked = 0;
  std::vector<bool> used((size_t)B.n_pages * kPageTokens, false);
  for (int b = 0; b < nb; ++b)
    for (int t = 0; t < lens[b]; ++t) {
      const int pg = B.page_table[(size_t)b * B.max_pages + t / kPageTokens], slot = t % kPageTokens;
      used[(size_t)pg * kPageTokens + slot] = true;
      const std::span<const uint8_t> mine = std::span<const uint8_t>(pool).subspan((size_t)pg * L.page_bytes(), L.page_bytes());
      const std::span<const uint8_t> theirs = caches[b]->page(0, t / kPageTokens);
      for (int h = 0; h < hkv; ++h)
        for (int s = 0; s < 2; ++s) {
          const Side side = s == 0 ? Side::key : Side::value;
          const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
          for (int g = 0; g < (int)specs.size(); ++g) {
            const int m = (int)specs[g].channels.size();
            std::vector<uint8_t> a(m), c(m);
            read_codes(L, mine, h, side, g, slot, a);
            read_codes(L, theirs, h, side, g, slot, c);
            codes_checked += m;
            if (a != c) {
              const float* x = (s == 0 ? K[b] : V[b]).data() + ((size_t)t * hkv + h) * d;
              std::vector<float> xg(m);
              for (int i = 0; i < m; ++i) xg[i] = x[specs[g].channels[i]];
              const ref::TqMseCode e = ref::tq_mse_encode(plan.rotation(h, side, g), plan.levels(h, side, g), xg);
              for (int j = 0; j < m; ++j)
                if (a[j] != c[j]) {
                  ++ties;
                  EXPECT_EQ(std::abs(a[j] - c[j]), 1);
                  EXPECT_LT(e.margin[j], 1e-5) << "b " << b << " t " << t << " h " << h << " side " << s << " group "
                                               << g << " coord " << j;
                }
            }
            const int na = read_norm(L, mine, h, side, g, slot), nc = read_norm(L, theirs, h, side, g, slot);
            EXPECT_LE(std::abs(na - nc), 1) << "fp16 norms more than one ulp apart";
            norm_ulps += na != nc;
          }
        }
    }
  EXPECT_LE(ties, 2 + codes_checked / 100000);
  EXPECT_LE(norm_ulps, 2);
  // Untouched slots: every group's codes and norms as before.
  const std::span<const uint8_t> now(pool), was(before);
  for (int pg = 0; pg < B.n_pages; ++pg)
    for (int slot = 0; slot < kPageTokens; ++slot) {
      if (used[(size_t)pg * kPageTokens + slot]) continue;
      const auto pn = now.subspan((size_t)pg * L.page_bytes(), L.page_bytes());
      const auto pw = was.subspan((size_t)pg * L.page_bytes(), L.page_bytes());
      for (int h = 0; h < hkv; ++h)
        for (Side side : {Side::key, Side::value})
          for (int g = 0; g < (int)L.head(h).side(side).size(); ++g) {
            const int m = L.head(h).side(side)[g].dim;
            std::vector<uint8_t> a(m), c(m);
            read_codes(L, pn, h, side, g, slot, a);
            read_codes(L, pw, h, side, g, slot, c);
            ASSERT_EQ(a, c) << "page " << pg << " slot " << slot << " changed";
            ASSERT_EQ(read_norm(L, pn, h, side, g, slot), read_norm(L, pw, h, side, g, slot));
          }
    }
}

}  // namespace

TEST(RefPackedQuantize, PagesEqualTheCpuPackedCachePages) {
  run_case(64, 3, true, 1);
  run_case(128, 2, false, 2);
  run_case(256, 1, true, 3);
}

TEST(RefPackedQuantize, BadInputsAreErrors) {
  std::mt19937 rng(4);
  const PackedTestPlan P = make_plan(64, 2, false, 3, 2, rng);
  const ref::PackedPlan plan = P.ref(2);
  const TestBatch B = make_batch({63, 5}, rng, 2);
  std::vector<uint8_t> pool((size_t)B.n_pages * P.layout->page_bytes());
  std::vector<float> kv(2 * 2 * 2 * 64, 0.5f);
  EXPECT_NO_THROW(ref::packed_prefill(plan, B.ref(), pool, kv, kv, 2));
  EXPECT_THROW(ref::packed_prefill(plan, B.ref(), pool, kv, kv, 0), Error);
  EXPECT_THROW(ref::packed_prefill(plan, B.ref(), pool, std::span<const float>(kv).first(kv.size() - 1), kv, 2), Error);
  EXPECT_THROW(ref::packed_prefill(plan, B.ref(), pool, kv, kv, 1), Error);  // k, v sized for 2 tokens
  std::vector<float> bad = kv;
  bad[7] = INFINITY;
  EXPECT_THROW(ref::packed_prefill(plan, B.ref(), pool, bad, kv, 2), Error);
  const std::vector<int32_t> past = {64 * B.max_pages - 1, 0};  // the second token would not fit
  EXPECT_THROW(ref::packed_prefill(plan, {B.page_table, B.max_pages, past}, pool, kv, kv, 2), Error);
  EXPECT_THROW(ref::packed_append(plan, B.ref(), std::span<uint8_t>(pool).first(P.layout->page_bytes()),
                                  std::span<const float>(kv).first(2 * 2 * 64), std::span<const float>(kv).first(2 * 2 * 64)),
               Error);  // page ids past the pool
  const PackedTestPlan W = make_plan(64, 2, false, 0, 0, rng, Special::wide);
  const ref::PackedPlan wplan = W.ref(2);
  std::vector<uint8_t> wpool((size_t)B.n_pages * W.layout->page_bytes());
  EXPECT_THROW(ref::packed_append(wplan, B.ref(), wpool, std::span<const float>(kv).first(2 * 2 * 64),
                                  std::span<const float>(kv).first(2 * 2 * 64)),
               Error);  // the quantizers do not write extension pages
}
