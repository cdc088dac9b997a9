// ref::packed_decode_attention against an independent float64 computation:
// every cached token decoded to full vectors in the original channel order
// (x̂ = Σ_g n_g Π_gᵀ c_g[idx], codes read with the format's reference reader),
// then softmax(q̃ · K̂ᵀ) V̂ in double. The reference instead rotates the query
// into each key group's domain and accumulates values in the rotated domain.
//  * exact rounding, Haar rotations: q̃ = scale · q, fp32 levels;
//  * fp16 / int8_levels rounding, signed-permutation rotations (so rounding the
//    rotated query equals rounding q̃ = fp16(scale · q) channel by channel):
//    levels fp16-rounded, or at ref::int8_levels (keys and values) for
//    PackedRounding::int8_levels.
// Random pages (every bit pattern is a code; fp16 norms in [0.5, 2)), shuffled
// page tables, lengths 1, 64, 65, 97, 130, 200, unequal in a batch, GQA
// 1/3/4/7/8, head_dim 64/128/256, mixed widths, 0-bit sides, 5..8-bit groups.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "../support/packed_plans.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/ref/int8_levels.h"
#include "ratekv/ref/packed_decode_attention.h"

using namespace ratekv;
using namespace ratekv::packed;
using namespace ratekv_test;
using ref::PackedRounding;

namespace {

struct Case {
  int d, hkv, gqa;
  std::vector<int> lens;
  bool mixed;
  int kb, vb;
  Special sp = Special::none;
};

std::string name(const Case& c) {
  std::string s = "d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " gqa=" + std::to_string(c.gqa) +
                  (c.mixed ? " mixed" : " K" + std::to_string(c.kb) + "V" + std::to_string(c.vb)) +
                  (c.sp == Special::zero_bit ? " zero-bit" : c.sp == Special::wide ? " wide" : "") + " lens=";
  for (int l : c.lens) s += std::to_string(l) + ",";
  return s;
}

// The independent computation (see the file comment). Offsets of rotations
// and levels are walked here from the plan's own widths (PackedTestPlan::bits).
std::vector<double> decoded_softmax(const PackedTestPlan& P, const TestBatch& B, const std::vector<uint8_t>& pool,
                                    const std::vector<uint8_t>& ext_pool, const std::vector<float>& q, int gqa,
                                    float scale, PackedRounding rounding, int window = 0) {
  const LayerLayout& L = *P.layout;
  const int d = L.head_dim(), hkv = L.n_kv_heads(), hq = hkv * gqa, nb = (int)B.lens.size();
  // rot / lvl offsets per (h, s, g)
  std::vector<std::vector<size_t>> ro(hkv * 2), lo(hkv * 2);
  size_t r_at = 0, l_at = 0;
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s)
      for (size_t g = 0; g < P.bits[h * 2 + s].size(); ++g) {
        const size_t m = (s == 0 ? L.spec(h).key : L.spec(h).value)[g].channels.size();
        ro[h * 2 + s].push_back(r_at);
        lo[h * 2 + s].push_back(l_at);
        r_at += m * m;
        l_at += size_t{1} << P.bits[h * 2 + s][g];
      }
  EXPECT_EQ(r_at, P.rot.size());
  EXPECT_EQ(l_at, P.lvl.size());
  // The levels each group decodes with, per (h, s, g).
  std::vector<std::vector<std::vector<double>>> lvt(hkv * 2);
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s)
      for (size_t g = 0; g < P.bits[h * 2 + s].size(); ++g) {
        const std::span<const float> lv(P.lvl.data() + lo[h * 2 + s][g], size_t{1} << P.bits[h * 2 + s][g]);
        std::vector<double> t;
        if (rounding == PackedRounding::exact) t.assign(lv.begin(), lv.end());
        else if (rounding == PackedRounding::int8_levels) {
          const std::vector<float> l8 = ref::int8_levels(lv);
          t.assign(l8.begin(), l8.end());
        } else {
          for (float v : lv) t.push_back(round_fp16(v));
        }
        lvt[h * 2 + s].push_back(std::move(t));
      }
  std::vector<double> out(q.size(), 0.0);
  for (int b = 0; b < nb; ++b) {
    const int T = B.lens[b];
    for (int h = 0; h < hkv; ++h) {
      std::vector<double> K((size_t)T * d, 0.0), V((size_t)T * d, 0.0);
      for (int t = 0; t < T; ++t) {
        const int pg = B.page_table[(size_t)b * B.max_pages + t / kPageTokens], slot = t % kPageTokens;
        for (int s = 0; s < 2; ++s) {
          const Side side = s == 0 ? Side::key : Side::value;
          const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
          int e = 0;  // extension group of the next wide group
          for (size_t g = 0; g < specs.size(); ++g) {
            const int m = (int)specs[g].channels.size();
            std::vector<uint8_t> codes(m), hi(m);
            read_codes(L, std::span<const uint8_t>(pool).subspan((size_t)pg * L.page_bytes(), L.page_bytes()), h,
                       side, (int)g, slot, codes);
            if (P.bits[h * 2 + s][g] > kMaxBits) {
              read_codes(*P.ext,
                         std::span<const uint8_t>(ext_pool).subspan((size_t)pg * P.ext->page_bytes(), P.ext->page_bytes()),
                         h, side, e++, slot, hi);
              for (int j = 0; j < m; ++j) codes[j] |= hi[j] << 4;
            }
            const double n = fp16_to_fp32(read_norm(
                L, std::span<const uint8_t>(pool).subspan((size_t)pg * L.page_bytes(), L.page_bytes()), h, side,
                (int)g, slot));
            const float* R = P.rot.data() + ro[h * 2 + s][g];
            const std::vector<double>& lt = lvt[h * 2 + s][g];
            std::vector<double> c(m);
            for (int j = 0; j < m; ++j) c[j] = lt[codes[j]];
            double* x = (s == 0 ? K : V).data() + (size_t)t * d;
            for (int i = 0; i < m; ++i) {
              double a = 0;
              for (int j = 0; j < m; ++j) a += (double)R[(size_t)j * m + i] * c[j];
              x[specs[g].channels[i]] = n * a;
            }
          }
        }
      }
      for (int r = 0; r < gqa; ++r) {
        const int qh = h * gqa + r;
        const float* qv = q.data() + ((size_t)b * hq + qh) * d;
        std::vector<double> qt(d), p(T);
        for (int c = 0; c < d; ++c)
          qt[c] = rounding == PackedRounding::exact ? (double)scale * qv[c] : (double)round_fp16(scale * qv[c]);
        double mx = -INFINITY;
        for (int t = 0; t < T; ++t) {
          // The CPU runtime's sliding window (AttnParams::sliding_window): the
          // query at position T − 1 sees keys at t > T − 1 − window only.
          if (window > 0 && !(t > T - 1 - window)) {
            p[t] = -INFINITY;
            continue;
          }
          double s = 0;
          for (int c = 0; c < d; ++c) s += qt[c] * K[(size_t)t * d + c];
          mx = std::max(mx, p[t] = s);
        }
        double l = 0;
        for (int t = 0; t < T; ++t) l += (p[t] = std::exp(p[t] - mx));
        for (int c = 0; c < d; ++c) {
          double o = 0;
          for (int t = 0; t < T; ++t) o += p[t] * V[(size_t)t * d + c];
          out[((size_t)b * hq + qh) * d + c] = o / l;
        }
      }
    }
  }
  return out;
}

// window > 0: also the reference with ref::DecodeBatch::window = window
// against decoded_softmax's window, and (where the window cuts keys) it must
// differ from the unwindowed reference by more than 1e-2 (returned: the
// smallest such difference, or +inf).
double run_case(const Case& c, uint32_t seed, int window = 0) {
  SCOPED_TRACE(name(c) + " window " + std::to_string(window));
  double cut_min = INFINITY;
  const int hq = c.hkv * c.gqa, nb = (int)c.lens.size();
  const float scale = 1.f / std::sqrt((float)c.d);
  for (const PackedRounding rounding : {PackedRounding::exact, PackedRounding::fp16, PackedRounding::int8_levels}) {
    if (rounding == PackedRounding::int8_levels && c.sp == Special::wide) continue;  // int8 levels: ≤ 4-bit groups
    SCOPED_TRACE(rounding == PackedRounding::exact ? "exact" : rounding == PackedRounding::fp16 ? "fp16" : "int8_levels");
    std::mt19937 rng(seed);
    // Rounding the rotated query commutes with a signed permutation only.
    const PackedTestPlan P = make_plan(c.d, c.hkv, c.mixed, c.kb, c.vb, rng, c.sp, false,
                                       rounding == PackedRounding::exact ? Rotations::haar : Rotations::signed_permutation);
    const TestBatch B = make_batch(c.lens, rng);
    const std::vector<uint8_t> pool = random_pages(*P.layout, B.n_pages, rng);
    std::vector<uint8_t> ext_pool(P.ext ? (size_t)B.n_pages * P.ext->page_bytes() : 0);
    for (auto& x : ext_pool) x = (uint8_t)rng();
    std::normal_distribution<float> N;
    std::vector<float> q((size_t)nb * hq * c.d);
    for (auto& x : q) x = 2.f * N(rng);
    const ref::PackedPlan plan = P.ref(hq);
    ref::DecodeBatch rb = B.ref();
    rb.window = window;
    const std::vector<float> out = ref::packed_decode_attention(plan, rb, pool, ext_pool, q, scale, rounding);
    const std::vector<double> want = decoded_softmax(P, B, pool, ext_pool, q, c.gqa, scale, rounding, window);
    if (window > 0) {
      const std::vector<float> full = ref::packed_decode_attention(plan, B.ref(), pool, ext_pool, q, scale, rounding);
      for (int b = 0; b < nb; ++b)
        if (c.lens[b] > window) cut_min = std::min(cut_min, rel_err(out, full, b * (size_t)hq * c.d, (size_t)hq * c.d));
    }
    const size_t n = (size_t)hq * c.d;
    double worst = 0;
    for (int b = 0; b < nb; ++b) {
      const double e = rel_err(out, want, b * n, n);
      worst = std::max(worst, e);
      EXPECT_LT(e, 1e-6) << "sequence " << b;
    }
    std::printf("  %s %s: rel err %.2e\n", name(c).c_str(),
                rounding == PackedRounding::exact ? "exact" : rounding == PackedRounding::fp16 ? "fp16" : "int8_levels", worst);
    if (rounding != PackedRounding::exact) {  // the rounding is really applied: the exact mode differs
      const std::vector<float> ex =
          ref::packed_decode_attention(plan, rb, pool, ext_pool, q, scale, PackedRounding::exact);
      const double e = rel_err(out, ex, 0, out.size());
      EXPECT_GT(e, 1e-5);
      EXPECT_LT(e, 2e-2);
    }
  }
  return cut_min;
}

}  // namespace

TEST(RefPackedDecode, EqualsDecodedVectorSoftmax) {
  const Case cases[] = {
      {64, 3, 1, {1, 97, 200}, true, 0, 0},
      {128, 2, 3, {97, 1}, false, 3, 2},
      {256, 1, 4, {200, 65}, false, 4, 4},
      {64, 1, 8, {97, 64}, false, 1, 1},
      {128, 2, 7, {130}, true, 0, 0},
  };
  uint32_t seed = 10;
  for (const Case& c : cases) run_case(c, seed++);
}

// Sides without groups (scores 0, output 0) and 0-bit channels.
TEST(RefPackedDecode, ZeroBitSides) {
  run_case({64, 3, 4, {1, 97, 130}, false, 0, 0, Special::zero_bit}, 20);
  run_case({256, 3, 1, {65, 1}, false, 0, 0, Special::zero_bit}, 21);
}

// ref::DecodeBatch::window (the CPU runtime's sliding window) against the
// independent computation with the window applied as a key mask: W ∈ {1, 15,
// 16, 17, 48, 100}, window starts on, before and after tile (16) and page (64)
// boundaries, unequal lengths; where the window cuts keys the result differs
// from the unwindowed reference (so the window is really applied).
TEST(RefPackedDecode, SlidingWindow) {
  uint32_t seed = 60;
  for (const int W : {1, 15, 16, 17, 48, 100}) {
    double cut = run_case({64, 2, 4, {1, 16, 17, 97, 130, 300}, true, 0, 0}, seed++, W);
    cut = std::min(cut, run_case({128, 1, 8, {300, 65, 64, 33}, false, 3, 3}, seed++, W));
    cut = std::min(cut, run_case({256, 1, 1, {116, 49}, false, 2, 4}, seed++, W));
    EXPECT_GT(cut, 1e-2) << "window " << W;
    std::printf("  window %d: smallest windowed-vs-unwindowed difference where keys are cut %.2e\n", W, cut);
  }
}

// 5..8-bit groups: low nibble in the pages, high bits in the extension pages.
TEST(RefPackedDecode, WideGroups) {
  run_case({64, 2, 4, {1, 97, 200}, false, 0, 0, Special::wide}, 30);
  run_case({128, 3, 8, {97, 1}, false, 0, 0, Special::wide}, 31);
}

// A KV head with no key groups weighs every token equally: its output is the
// plain mean of the decoded values.
TEST(RefPackedDecode, NoKeyGroupsAveragesTheValues) {
  std::mt19937 rng(40);
  const PackedTestPlan P = make_plan(64, 3, false, 0, 0, rng, Special::zero_bit);  // head 0: no key groups
  ASSERT_TRUE(P.layout->head(0).key.empty());
  const TestBatch B = make_batch({97}, rng);
  const std::vector<uint8_t> pool = random_pages(*P.layout, B.n_pages, rng);
  std::vector<float> q(3 * 64);
  std::normal_distribution<float> N;
  for (auto& x : q) x = N(rng);
  const ref::PackedPlan plan = P.ref(3);
  const auto out = ref::packed_decode_attention(plan, B.ref(), pool, {}, q, 0.125f, PackedRounding::exact);
  // mean over tokens of n · Πᵀ c[idx] of head 0's one value group (all channels)
  const auto& G = P.layout->spec(0).value[0];
  const std::span<const float> R = plan.rotation(0, Side::value, 0), lv = plan.levels(0, Side::value, 0);
  std::vector<double> mean(64, 0.0);
  for (int t = 0; t < 97; ++t) {
    const std::span<const uint8_t> page =
        std::span<const uint8_t>(pool).subspan((size_t)B.page_table[t / 64] * P.layout->page_bytes(), P.layout->page_bytes());
    std::vector<uint8_t> codes(64);
    read_codes(*P.layout, page, 0, Side::value, 0, t % 64, codes);
    const double n = fp16_to_fp32(read_norm(*P.layout, page, 0, Side::value, 0, t % 64));
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) mean[G.channels[i]] += n * R[j * 64 + i] * lv[codes[j]] / 97.0;
  }
  std::vector<float> row(out.begin(), out.begin() + 64);
  EXPECT_LT(rel_err(row, mean, 0, 64), 1e-6);
}

TEST(RefPackedDecode, BadInputsAreErrors) {
  std::mt19937 rng(50);
  const PackedTestPlan P = make_plan(64, 2, false, 3, 3, rng);
  const ref::PackedPlan plan = P.ref(4);
  const TestBatch B = make_batch({97, 5}, rng);
  const std::vector<uint8_t> pool = random_pages(*P.layout, B.n_pages, rng);
  const std::vector<float> q(2 * 4 * 64, 0.5f);
  const auto run = [&](const ref::DecodeBatch& db, std::span<const uint8_t> pl, std::span<const float> qq) {
    return ref::packed_decode_attention(plan, db, pl, {}, qq, 0.125f, PackedRounding::fp16);
  };
  EXPECT_NO_THROW(run(B.ref(), pool, q));
  EXPECT_THROW(run(B.ref(), pool, std::span<const float>(q).first(q.size() - 1)), Error);  // q size
  EXPECT_THROW(run(B.ref(), std::span<const uint8_t>(pool).first(pool.size() - 1), q), Error);  // not whole pages
  EXPECT_THROW(run(B.ref(), std::span<const uint8_t>(pool).first(P.layout->page_bytes()), q), Error);  // page ids
  ref::DecodeBatch neg = B.ref();
  neg.window = -3;
  EXPECT_THROW(run(neg, pool, q), Error);  // window < 0
  std::vector<int32_t> zero = {0, 5};
  EXPECT_THROW(run({B.page_table, B.max_pages, zero}, pool, q), Error);  // empty sequence
  std::vector<int32_t> long_lens = {97, 129};
  EXPECT_THROW(run({B.page_table, B.max_pages, long_lens}, pool, q), Error);  // past max_pages
  EXPECT_THROW(ref::PackedPlan(*P.layout, 3, P.rot, P.lvl), Error);          // n_heads not a multiple
  std::vector<float> bad = P.lvl;
  std::swap(bad[0], bad[1]);
  EXPECT_THROW(ref::PackedPlan(*P.layout, 4, P.rot, bad), Error);  // levels not ascending
  EXPECT_THROW(ref::PackedPlan(*P.layout, 4, std::span<const float>(P.rot).first(P.rot.size() - 1), P.lvl), Error);
  // int8 levels need ≤ 4-bit groups.
  const PackedTestPlan W = make_plan(64, 2, false, 0, 0, rng, Special::wide);
  const ref::PackedPlan wplan = W.ref(2);
  const TestBatch WB = make_batch({3}, rng);
  const std::vector<uint8_t> wpool = random_pages(*W.layout, WB.n_pages, rng);
  const std::vector<uint8_t> wext((size_t)WB.n_pages * W.ext->page_bytes(), 0);
  const std::vector<float> wq(2 * 64, 0.5f);
  EXPECT_NO_THROW(ref::packed_decode_attention(wplan, WB.ref(), wpool, wext, wq, 0.125f, PackedRounding::fp16));
  EXPECT_THROW(ref::packed_decode_attention(wplan, WB.ref(), wpool, wext, wq, 0.125f, PackedRounding::int8_levels), Error);
  EXPECT_THROW(ref::packed_decode_attention(wplan, WB.ref(), wpool, {}, wq, 0.125f, PackedRounding::fp16), Error);
  // An extension layout whose group has no 4-bit partner.
  EXPECT_THROW(ref::PackedPlan(*P.layout, LayerLayout::uniform(64, 2, 2, 2), 4, P.rot, P.lvl), Error);
}
