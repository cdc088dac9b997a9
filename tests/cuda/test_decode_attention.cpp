// CUDA decode attention (packed, fp16), quantize-append and quantize-prefill
// against their named CPU references (include/ratekv/ref/, tested on the CPU
// in tests/ref): ref::packed_decode_attention with the rounding each kernel
// variant uses (fp16 rotated query and levels; int8 key and value levels where
// cuda::uses_int8_levels), ref::fp16_decode_attention, ref::packed_append /
// ref::packed_prefill — on random pages and on real SmolLM2 K/V/Q
// (RATEKV_CUDA_CAPTURE). Needs a GPU: skips when none is visible.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <utility>

#include "../support/cuda_test.h"
#include "../support/packed_plans.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/io/npy.h"
#include "ratekv/quant/lloyd_max.h"
#include "ratekv/ref/fp16_decode_attention.h"
#include "ratekv/ref/packed_decode_attention.h"
#include "ratekv/ref/packed_quantize.h"

using namespace ratekv;
using namespace ratekv::packed;
using namespace ratekv_test;
using ratekv::cuda::DType;

namespace {

/// Real activations of one layer (ratekv capture --queries): post-RoPE keys,
/// values and queries, head-major: k, v (hkv, n, d), q (hkv·gqa, n, d).
struct RealData {
  std::string name;
  int hkv = 0, gqa = 0, d = 0, n = 0;
  std::vector<float> k, v, q;
};

struct Case {
  int d, hkv, gqa;
  std::vector<int> lens;
  bool mixed;
  int kb, vb;
  DType q_dtype;
  Special sp = Special::none;
  /// Real data: pages written by packed_prefill from R's K/V (every sequence
  /// the captured tokens 0..len−1), sequence b's query = the captured query of
  /// its last token; plan codebooks Lloyd–Max.
  const RealData* real = nullptr;
  /// Split counts to run (0 = cuda::default_splits); empty = {0}. The
  /// workspace is sized for the largest.
  std::vector<int> splits = {};
  /// Key group 1 of every head (Special::groups / key_groups: the 4-bit
  /// group) made narrow: its codebook levels × narrow_key and its norms ÷
  /// narrow_key (the same keys; its int8 codebook scale then ≈ 1/44 … 1/53
  /// of the head's largest at narrow_key = 1/64, by head_dim); 0 = unchanged.
  float narrow_key = 0.f;
};

std::string name(const Case& c) {
  std::string s = "d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) +
                  " gqa=" + std::to_string(c.gqa) + (c.mixed ? " mixed" : " uniform K" +
                  std::to_string(c.kb) + "V" + std::to_string(c.vb)) +
                  (c.sp == Special::zero_bit ? " zero-bit sides"
                   : c.sp == Special::wide   ? " 5..8-bit groups"
                   : c.sp == Special::groups ? " 3+3 groups of 1..4 bits"
                   : c.sp == Special::key_groups ? " 3 key groups, V 1..4 bits over the head"
                                             : "") +
                  (c.narrow_key > 0.f ? " narrow key group 1" : "") +
                  (c.real ? " real " + c.real->name : "") + " lens=";
  if (c.lens.size() > 12)  // large batches: the count and the range
    return s + std::to_string(c.lens.size()) + " sequences, " +
           std::to_string(*std::min_element(c.lens.begin(), c.lens.end())) + ".." +
           std::to_string(*std::max_element(c.lens.begin(), c.lens.end()));
  for (int l : c.lens) s += std::to_string(l) + ",";
  return s;
}

/// The kernel cuda::packed_decode_attention should pick for case c under
/// `variant`, from the case's description alone (not from the plan's tables):
/// the test of the dispatch that the results cannot give (the general int8
/// instances agree with each other on every plan they both take).
std::string expected_kernel(const Case& c, cuda::PackedDecodeVariant variant) {
  if (c.sp == Special::wide) return "generic (5..8-bit groups)";
  if (c.gqa > 8) return "16-row fp16 (GQA > 8)";
  if (variant == cuda::PackedDecodeVariant::runtime_tables) return "GQA<=8 general fp16";
  // zero_bit: head 1 has no value group, so with hkv ≥ 2 (every case here) no
  // plan is full-value; a one-head zero_bit plan (head 0: one value group over
  // the head) would be.
  if (c.sp == Special::groups || c.sp == Special::zero_bit || c.sp == Special::value_groups)
    return "GQA<=8 general int8";
  if (c.mixed || c.sp == Special::key_groups || c.kb != c.vb) return "GQA<=8 general int8, one value group per head";
  return "GQA<=8 uniform int8, " + std::to_string(c.kb) + " bits";
}

void run_packed_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(name(c));
  std::mt19937 rng(seed);
  PackedTestPlan P = make_plan(c.d, c.hkv, c.mixed, c.kb, c.vb, rng, c.sp, c.real != nullptr);
  const LayerLayout& L = *P.layout;
  const int hq = c.hkv * c.gqa, nb = (int)c.lens.size();
  if (c.narrow_key > 0.f) {  // levels of key group 1 (P.lvl: heads, then sides, then groups)
    size_t at = 0;
    for (int h = 0; h < c.hkv; ++h)
      for (int s = 0; s < 2; ++s)
        for (size_t g = 0; g < P.bits[(size_t)h * 2 + s].size(); ++g) {
          const size_t n = (size_t)1 << P.bits[(size_t)h * 2 + s][g];
          if (s == 0 && g == 1)
            for (size_t i = 0; i < n; ++i) P.lvl[at + i] *= c.narrow_key;
          at += n;
        }
    ASSERT_EQ(at, P.lvl.size());
  }
  TestBatch B = make_batch(c.lens, rng);
  std::unique_ptr<cuda::PackedPlan> plan_ptr =
      P.ext ? std::make_unique<cuda::PackedPlan>(L, *P.ext, hq, P.rot, P.lvl)
            : std::make_unique<cuda::PackedPlan>(L, hq, P.rot, P.lvl);
  const cuda::PackedPlan& plan = *plan_ptr;
  for (const auto v : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables})
    EXPECT_EQ(cuda::packed_decode_kernel_name(plan, v), expected_kernel(c, v));
  // Every bit pattern is a valid code: random bytes, then valid fp16 norms in [0.5, 2).
  HostPagePool pool{&L, random_pages(L, B.n_pages, rng)};
  if (c.real) {  // real K/V quantized into the pages by the GPU prefill (slots past a length stay random)
    const RealData& R = *c.real;
    ASSERT_TRUE(R.hkv == c.hkv && R.gqa == c.gqa && R.d == c.d && R.n >= B.max_len);
    const int nt = B.max_len;
    std::vector<float> kx((size_t)nb * nt * c.hkv * c.d), vx(kx.size());
    for (int b = 0; b < nb; ++b)
      for (int i = 0; i < nt; ++i)
        for (int h = 0; h < c.hkv; ++h) {
          const size_t dst = (((size_t)b * nt + i) * c.hkv + h) * c.d, src = ((size_t)h * R.n + i) * c.d;
          std::copy_n(R.k.data() + src, c.d, kx.data() + dst);
          std::copy_n(R.v.data() + src, c.d, vx.data() + dst);
        }
    DevBuf<uint8_t> dp(pool.bytes);
    DevBuf<float> dk(kx), dv(vx);
    DevBuf<int32_t> dpt0(B.page_table), dlen0(std::vector<int32_t>(nb, 0));
    cuda::DecodeBatch pb{dpt0.p, B.max_pages, dlen0.p, nb, nt};
    cuda::packed_prefill(plan, pb, dp.p, dk.p, dv.p, nt, DType::f32, nullptr);
    CK(cudaDeviceSynchronize());
    pool.bytes = dp.get();
  }
  if (c.narrow_key > 0.f)  // norms of key group 1 ÷ narrow_key: random in [0.5, 2) / narrow_key
    for (int p = 0; p < B.n_pages; ++p)
      for (int h = 0; h < c.hkv; ++h)
        for (int t = 0; t < kPageTokens; ++t)
          write_norm(L, pool.page(p), h, Side::key, 1, t,
                     fp32_to_fp16(fp16_to_fp32(read_norm(L, pool.page(p), h, Side::key, 1, t)) / c.narrow_key));
  // Extension pages (high bits of 5..8-bit groups): random bytes, same page table.
  std::vector<uint8_t> ext_pool(P.ext ? (size_t)B.n_pages * P.ext->page_bytes() : 0);
  for (auto& x : ext_pool) x = (uint8_t)rng();
  std::normal_distribution<float> N;
  std::vector<float> q((size_t)nb * hq * c.d);
  for (auto& x : q) x = N(rng);
  if (c.real)
    for (int b = 0; b < nb; ++b)
      for (int qh = 0; qh < hq; ++qh)
        std::copy_n(c.real->q.data() + ((size_t)qh * c.real->n + c.lens[b] - 1) * c.d, c.d,
                    q.data() + ((size_t)b * hq + qh) * c.d);
  const std::vector<uint16_t> q16 = fp16_queries(q, c.q_dtype);
  const float scale = 1.f / std::sqrt((float)c.d);

  // ---- GPU ----
  DevBuf<uint8_t> dpool(pool.bytes), dext(ext_pool);
  DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
  DevBuf<float> dq(q);
  DevBuf<uint16_t> dq16(q16);
  DevBuf<float> dout((size_t)nb * hq * c.d);
  const std::vector<int> split_counts = c.splits.empty() ? std::vector<int>{0} : c.splits;
  int ws_splits = 1;
  for (int n : split_counts) ws_splits = std::max(ws_splits, n > 0 ? n : cuda::default_splits(plan, nb, B.max_len));
  const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, c.d, ws_splits);
  DevBuf<uint8_t> ws(ws_bytes);
  cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len};
  const void* qp = c.q_dtype == DType::f16 ? (void*)dq16.p : dq.p;

  // ---- the named CPU reference, with the rounding of each variant ----
  const ref::PackedPlan rplan = P.ref(hq);
  const std::vector<float> reference =
      ref::packed_decode_attention(rplan, B.ref(), pool.bytes, ext_pool, q, scale, ref::PackedRounding::fp16);
  const bool int8_levels = !P.ext && cuda::uses_int8_levels(plan, cuda::PackedDecodeVariant::specialized);
  const std::vector<float> ref8 =
      int8_levels ? ref::packed_decode_attention(rplan, B.ref(), pool.bytes, ext_pool, q, scale,
                                               ref::PackedRounding::int8_levels)
                : std::vector<float>{};

  for (const int n_splits : split_counts) {
    const int splits = n_splits > 0 ? n_splits : cuda::default_splits(plan, nb, B.max_len);
    SCOPED_TRACE("splits " + std::to_string(splits) + (n_splits == 0 ? " (default)" : ""));
    std::vector<std::vector<float>> outs;
    if (P.ext) {  // generic kernel (extension pages); run twice so both result slots are filled
      for (int rep = 0; rep < 2; ++rep) {
        CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
        CK(cudaMemset(ws.p, 0xff, ws_bytes));  // a state or query row nobody writes reads as NaN
        cuda::packed_decode_attention(plan, db, dpool.p, dext.p, qp, c.q_dtype, scale, dout.p, ws.p,
                                      ws_bytes, splits, nullptr);
        CK(cudaDeviceSynchronize());
        outs.push_back(dout.get());
      }
      EXPECT_THROW(cuda::packed_decode_attention(plan, db, dpool.p, qp, c.q_dtype, scale, dout.p, ws.p,
                                                 ws_bytes, splits, nullptr),
                   ratekv::Error);  // a wide plan needs the extension pages
    } else {
      for (auto variant : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables}) {
        CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
        CK(cudaMemset(ws.p, 0xff, ws_bytes));  // a state or query row nobody writes reads as NaN
        cuda::packed_decode_attention(plan, db, dpool.p, qp, c.q_dtype, scale, dout.p, ws.p, ws_bytes,
                                      splits, nullptr, variant);
        CK(cudaDeviceSynchronize());
        outs.push_back(dout.get());
      }
    }
    const std::vector<float>& out = outs[0];
    for (int b = 0; b < nb; ++b) {
      const int T = c.lens[b];
      const size_t n = (size_t)hq * c.d;
      const double e = rel_err(out, int8_levels ? ref8 : reference, (size_t)b * n, n);
      EXPECT_LT(e, 1e-3) << "specialized variant, sequence " << b << " (length " << T << ")";
      if (int8_levels) {  // what the int8 codebooks cost against fp16 levels
        // Relative to the largest output a row can have (max value norm of the
        // sequence · max |value level| · √(elements)): the value levels' rounding
        // (≤ s/2 ≤ 1.125/254 of max|L| per rotated element, an orthogonal Π)
        // moves the output by at most 4.4e-3 of it; the key levels' share is
        // smaller. (Relative to the output itself the number is ill-conditioned:
        // random codes average to an output near 0 while the rounding is a
        // fixed bias per code.)
        double vmax = 0, lmax = 0;
        for (float v : P.lvl) lmax = std::max(lmax, (double)std::fabs(v));
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < c.hkv; ++h)
            for (int g = 0; g < (int)P.layout->head(h).value.size(); ++g)
              vmax = std::max(vmax, (double)std::fabs(fp16_to_fp32(read_norm(
                                        *P.layout, pool.page(B.page_table[(size_t)b * B.max_pages + t / kPageTokens]),
                                        h, Side::value, g, t % kPageTokens))));
        double d2 = 0;
        for (size_t i = (size_t)b * n; i < (size_t)(b + 1) * n; ++i)
          d2 += ((double)ref8[i] - reference[i]) * ((double)ref8[i] - reference[i]);
        const double e8 = std::sqrt(d2) / (vmax * lmax * std::sqrt((double)n));
        EXPECT_LT(e8, 6e-3) << "int8 levels vs fp16 levels, sequence " << b;
        if (nb <= 16 || b % 16 == 0)
          std::printf("  %s seq %d: int8 levels move the reference by %.2e of the largest output, %.2e of the "
                      "output; kernel vs fp16-level reference %.2e (rel)\n",
                      name(c).c_str(), b, e8, rel_err(ref8, reference, (size_t)b * n, n),
                      rel_err(out, reference, (size_t)b * n, n));
      }
      const double e1 = rel_err(outs[1], reference, (size_t)b * n, n);
      EXPECT_LT(e1, 1e-3) << "runtime_tables variant, sequence " << b << " (length " << T << ")";
      if (nb <= 16 || b % 16 == 0 || e >= 1e-3 || e1 >= 1e-3)  // large batches: a sample of the lines
        std::printf("  %s splits %d seq %d len %d: rel err %.2e (specialized) %.2e (runtime_tables)\n",
                    name(c).c_str(), splits, b, T, e, e1);
    }
  }
}

}  // namespace

// Small, fast case (also the compute-sanitizer case): mixed groups, GQA 4.
TEST(CudaPackedDecode, Small) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_packed_case({64, 2, 4, {1, 97, 130}, true, 0, 0, DType::f32}, 11);
  run_packed_case({128, 2, 3, {1, 97, 130}, false, 2, 2, DType::f32}, 12);  // uniform instance
}

TEST(CudaPackedDecode, AwkwardLengthsBatchesGqa) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {128, 2, 4, {100003}, false, 3, 3, DType::f32},
      {64, 3, 8, {1, 97, 4096}, true, 0, 0, DType::f32},
      {128, 2, 8, {1, 97, 4096, 100003, 64, 65, 200, 5000}, true, 0, 0, DType::f16},
      {256, 1, 1, {97, 4096, 1}, false, 4, 2, DType::f32},
      {256, 2, 4, {100003, 1, 4096, 97, 33, 16, 17, 1000}, false, 2, 4, DType::f16},
      {128, 8, 4, {4096, 97, 1}, false, 1, 1, DType::f32},
      {64, 1, 1, {100003}, false, 4, 4, DType::f32},
      {64, 2, 8, {97, 1, 4096}, false, 2, 2, DType::f32},
      {128, 2, 3, {4096, 1, 97, 100003}, false, 2, 2, DType::f16},
      {256, 1, 4, {97, 4096}, false, 2, 2, DType::f32},
      {128, 8, 4, {4096, 1, 97}, false, 4, 4, DType::f16},
      {128, 2, 16, {97, 1, 5000}, false, 3, 3, DType::f32},  // GQA 16: 16-row general instance
      {64, 1, 12, {4096, 33}, true, 0, 0, DType::f16},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

// Split counts around the GQA ≤ 8 kernel's in-kernel merge: the splits of
// one CTA (≤ 8 warps, ≤ 4 at head_dim 256) are merged and rotated back by
// that CTA; with more, every CTA merges its own and the split-K merge launch
// merges the CTAs' states. 1 split, a few, one CTA's worth,
// one more, and 33 (splits without pages), besides the default; GQA 1/3/4/8,
// head_dim 64/128/256, uniform (K = V and K ≠ V), mixed (head_dim 64/128) and zero-bit plans, lengths 1, 97 and
// not multiples of the 64-token page, against the CPU reference.
TEST(CudaPackedDecode, SplitCountsAroundTheInKernelMerge) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {64, 2, 1, {1, 97, 700}, true, 0, 0, DType::f32, Special::none, nullptr, {0, 1, 3, 8, 9, 33}},
      {128, 2, 3, {97, 1, 1000}, false, 3, 3, DType::f16, Special::none, nullptr, {0, 1, 7, 8, 9, 33}},
      {128, 3, 4, {700, 1, 97}, true, 0, 0, DType::f32, Special::none, nullptr, {1, 4, 8, 9, 33}},
      {128, 2, 8, {1, 97, 520}, false, 4, 4, DType::f32, Special::none, nullptr, {1, 8, 9, 33}},
      {256, 1, 8, {1, 97, 600}, false, 2, 4, DType::f32, Special::none, nullptr, {0, 1, 3, 4, 5, 33}},
      // head_dim 256 K3V2 (the general instance: K ≠ V widths); mixed_head at 256 needs 18 padded
      // tiles, past the 16 the head_dim-256 kernels hold (the plan is refused at creation).
      {256, 2, 4, {600, 97}, false, 3, 2, DType::f16, Special::none, nullptr, {1, 4, 5}},
      {64, 3, 4, {1, 97, 300}, false, 0, 0, DType::f32, Special::zero_bit, nullptr, {1, 5, 8, 9}},
      // Many CTAs per row (each merges its warps' splits, the merge launch the CTAs' states): a
      // long sequence beside short ones, the default count (152 at B = 3 on the H200), 17 (a last
      // CTA with one split) and 65.
      {128, 2, 4, {20000, 1, 97}, false, 3, 3, DType::f16, Special::none, nullptr, {0, 17, 65}},
  };
  uint32_t seed = 1800;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

// A batch past one wave at short contexts (the serving regime of issues 18/19:
// Llama-3.1-8B shapes, 8 KV heads, GQA 4, B = 109 at depth ≤ 512; B = 300 at
// ≤ 97 tokens), unequal lengths with 1, 97 and 512 among them: the default
// split count (which fills the CTA's warps past one wave) and others, both
// paths of the merge, against the CPU reference. Splits past one CTA (9; 5
// at head_dim 256) take the merge launch, here with more query rows than SMs
// (its 2-blocks-per-SM instance): uniform and mixed plans (one and several
// value groups, Π staged in shared memory) and head_dim 256 (Π read from L2).
TEST(CudaPackedDecode, LargeBatchShortContexts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::vector<int> l109(109), l300(300), l40(40);
  for (int b = 0; b < 109; ++b) l109[b] = 1 + (b * 131 + 7) % 512;
  l109[0] = 1, l109[1] = 97, l109[2] = 512;
  for (int b = 0; b < 300; ++b) l300[b] = 1 + (b * 37) % 97;
  l300[0] = 1, l300[1] = 97;
  for (int b = 0; b < 40; ++b) l40[b] = 1 + (b * 53) % 600;
  const Case cases[] = {
      {128, 8, 4, l109, false, 3, 3, DType::f16, Special::none, nullptr, {0, 2, 9}},
      {128, 8, 4, l300, false, 3, 3, DType::f32, Special::none, nullptr, {0, 1}},
      {128, 8, 4, l109, true, 0, 0, DType::f32, Special::none, nullptr, {0, 9}},
      {64, 4, 8, l109, false, 2, 2, DType::f16, Special::none, nullptr, {0}},
      {256, 8, 3, l40, false, 3, 3, DType::f32, Special::none, nullptr, {0, 5}},
  };
  uint32_t seed = 1900;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

// default_splits for GQA ≤ 8 (1..4-bit groups) fills one CTA's warps (8; 4 at
// head_dim 256), or one split per page when there are fewer pages, also past
// one wave (large batches at short contexts: the kernel then merges in the
// CTA); long contexts keep more than a CTA's splits (the merge launch), GQA > 8
// (the 16-row kernel) its wave bound. Host only (the SM count of the visible
// device, 132 without one; the batches are past one wave on any of them).
TEST(CudaPackedDecode, DefaultSplitsFillTheCtaPastOneWave) {
  const LayerLayout L128 = LayerLayout::uniform(128, 8, 3, 3), L256 = LayerLayout::uniform(256, 8, 3, 3);
  EXPECT_EQ(cuda::default_splits(L128, 32, 109, 512), 8);   // was 2 on the H200 (6 of 8 warps idle)
  EXPECT_EQ(cuda::default_splits(L128, 32, 109, 8192), 8);
  EXPECT_EQ(cuda::default_splits(L128, 32, 300, 97), 2);    // 2 pages
  EXPECT_EQ(cuda::default_splits(L128, 32, 300, 1), 1);
  EXPECT_EQ(cuda::default_splits(L256, 32, 109, 512), 4);
  EXPECT_GT(cuda::default_splits(L128, 32, 1, 131072), 8);  // long contexts: more than one CTA
  EXPECT_GT(cuda::default_splits(L128, 32, 8, 131072), 8);
  EXPECT_LT(cuda::default_splits(L128, 128, 109, 512), 4);  // GQA 16: unchanged
}

// Real SmolLM2-135M activations (head_dim 64, 3 KV heads, GQA 3): the
// directory in RATEKV_CUDA_CAPTURE holds k/v/q_layer<l>.npy from
// `ratekv capture --queries` (tools/device/run_cuda.sh makes them). Uniform
// K3V3 and K2V2 and a Block-GTQ-like mixed plan, Lloyd–Max codebooks; pages
// written by the GPU prefill; lengths 1, 97 and the whole capture.
TEST(CudaPackedDecode, RealSmolLM2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const char* dir = std::getenv("RATEKV_CUDA_CAPTURE");
  if (!dir || !*dir)
    GTEST_SKIP() << "RATEKV_CUDA_CAPTURE is not set (a directory of `ratekv capture --queries` output)";
  int n_layers = 0;
  for (int layer = 0; layer < 64; ++layer) {
    const std::string base = std::string(dir) + "/";
    const std::string kp = base + "k_layer" + std::to_string(layer) + ".npy";
    if (!std::filesystem::exists(kp)) continue;
    const NpyMatrix K = read_npy_f32(kp, "RATEKV_CUDA_CAPTURE");
    const NpyMatrix V = read_npy_f32(base + "v_layer" + std::to_string(layer) + ".npy", "RATEKV_CUDA_CAPTURE");
    const NpyMatrix Q = read_npy_f32(base + "q_layer" + std::to_string(layer) + ".npy", "RATEKV_CUDA_CAPTURE");
    RealData R;
    R.name = "SmolLM2 layer " + std::to_string(layer);
    R.hkv = 3;  // SmolLM2-135M: 3 KV heads, 9 query heads, head_dim 64
    R.d = (int)K.cols;
    R.n = (int)(K.rows / R.hkv);
    R.gqa = (int)(Q.rows / R.n / R.hkv);
    ASSERT_EQ(R.d, 64);
    ASSERT_EQ(K.rows, V.rows);
    ASSERT_EQ((int64_t)R.hkv * R.gqa * R.n, Q.rows);
    ASSERT_GE(R.n, 98);
    R.k = K.data;
    R.v = V.data;
    R.q = Q.data;
    const Case cases[] = {
        {64, 3, R.gqa, {R.n, 97, 1}, false, 3, 3, DType::f32, Special::none, &R},
        {64, 3, R.gqa, {1, R.n, 97}, false, 2, 2, DType::f16, Special::none, &R},
        {64, 3, R.gqa, {97, R.n}, true, 0, 0, DType::f32, Special::none, &R},
    };
    uint32_t seed = 900 + layer;
    for (const Case& c : cases) run_packed_case(c, seed++);
    ++n_layers;
  }
  EXPECT_GT(n_layers, 0) << "no k_layer<l>.npy in " << dir;
}

// A NaN or infinite query element gives NaN for that query row (never a
// finite number: the integer kernels' conversion would otherwise
// turn NaN into 0), and leaves the other rows as they are; both variants,
// uniform and mixed plans.
TEST(CudaPackedDecode, NonFiniteQueryGivesNaNRow) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (const bool mixed : {false, true}) {
    std::mt19937 rng(31 + mixed);
    const int d = 64, hkv = 2, gqa = 4, hq = hkv * gqa, T = 100;
    PackedTestPlan P = make_plan(d, hkv, mixed, 3, 3, rng);
    const LayerLayout& L = *P.layout;
    cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
    TestBatch B = make_batch({T}, rng);
    HostPagePool pool{&L, std::vector<uint8_t>((size_t)B.n_pages * L.page_bytes())};
    for (auto& x : pool.bytes) x = (uint8_t)rng();
    for (int p = 0; p < B.n_pages; ++p)
      for (int h = 0; h < hkv; ++h)
        for (Side s : {Side::key, Side::value})
          for (int g = 0; g < (int)L.head(h).side(s).size(); ++g)
            for (int t = 0; t < kPageTokens; ++t) write_norm(L, pool.page(p), h, s, g, t, fp32_to_fp16(1.f));
    std::normal_distribution<float> N;
    for (const float bad : {NAN, INFINITY}) {
      std::vector<float> q((size_t)hq * d);
      for (auto& x : q) x = N(rng);
      q[(size_t)5 * d + 17] = bad;  // query row 5 (KV head 1, GQA row 1)
      DevBuf<uint8_t> dpool(pool.bytes);
      DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
      DevBuf<float> dq(q), dout((size_t)hq * d);
      const int splits = cuda::default_splits(plan, 1, T);
      const size_t ws_bytes = cuda::decode_workspace_bytes(1, hq, d, splits);
      DevBuf<uint8_t> ws(ws_bytes);
      cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, 1, T};
      for (auto variant : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables}) {
        CK(cudaMemset(dout.p, 0, dout.n * sizeof(float)));
        cuda::packed_decode_attention(plan, db, dpool.p, dq.p, DType::f32, 0.125f, dout.p, ws.p, ws_bytes,
                                      splits, nullptr, variant);
        CK(cudaDeviceSynchronize());
        const std::vector<float> out = dout.get();
        for (int r = 0; r < hq; ++r) {
          int n_nan = 0;
          for (int c = 0; c < d; ++c) n_nan += std::isnan(out[(size_t)r * d + c]);
          if (r == 5)
            EXPECT_EQ(n_nan, d) << "row with a non-finite query element, mixed=" << mixed;
          else
            EXPECT_EQ(n_nan, 0) << "row " << r << ", mixed=" << mixed;
        }
      }
    }
  }
}

// A NaN or infinite value norm of a written token gives a non-finite output in
// every row of its KV head (as fp16 P·n^V would; never a finite number from the
// integer kernels' P·V) and leaves the other KV head finite; one in an
// unwritten slot of the last page changes nothing. Both variants, uniform
// plans of 2 and 3 bits, the bad token on a full page, on the partial last
// page and past the length; split counts merged in the CTA (≤ 8) and by the
// merge launch (9, 16).
TEST(CudaPackedDecode, NonFiniteValueNormGivesNonFiniteRows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (const int bits : {2, 3}) {
    std::mt19937 rng(41 + bits);
    const int d = 128, hkv = 2, gqa = 4, hq = hkv * gqa, T = 100;
    PackedTestPlan P = make_plan(d, hkv, false, bits, bits, rng);
    const LayerLayout& L = *P.layout;
    cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
    ASSERT_EQ(cuda::packed_decode_kernel_name(plan, cuda::PackedDecodeVariant::specialized),
              "GQA<=8 uniform int8, " + std::to_string(bits) + " bits");
    TestBatch B = make_batch({T}, rng);
    std::normal_distribution<float> N;
    std::vector<float> q((size_t)hq * d);
    for (auto& x : q) x = N(rng);
    for (const int bad_t : {10, 70, 110})
      for (const float bad : {NAN, INFINITY}) {
        HostPagePool pool{&L, std::vector<uint8_t>((size_t)B.n_pages * L.page_bytes())};
        for (auto& x : pool.bytes) x = (uint8_t)rng();
        std::uniform_real_distribution<float> U(0.5f, 2.f);
        for (int p = 0; p < B.n_pages; ++p)
          for (int h = 0; h < hkv; ++h)
            for (Side s : {Side::key, Side::value})
              for (int t = 0; t < kPageTokens; ++t) write_norm(L, pool.page(p), h, s, 0, t, fp32_to_fp16(U(rng)));
        write_norm(L, pool.page(B.page_table[bad_t / kPageTokens]), 1, Side::value, 0, bad_t % kPageTokens,
                   fp32_to_fp16(bad));
        DevBuf<uint8_t> dpool(pool.bytes);
        DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
        DevBuf<float> dq(q), dout((size_t)hq * d);
        for (const int splits : {0, 1, 2, 9, 16}) {
          const int n_splits = splits > 0 ? splits : cuda::default_splits(plan, 1, T);
          const size_t ws_bytes = cuda::decode_workspace_bytes(1, hq, d, n_splits);
          DevBuf<uint8_t> ws(ws_bytes);
          cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, 1, T};
          for (auto variant : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables}) {
            SCOPED_TRACE("bits " + std::to_string(bits) + " token " + std::to_string(bad_t) + " norm " +
                         std::to_string(bad) + " splits " + std::to_string(n_splits) +
                         (variant == cuda::PackedDecodeVariant::specialized ? " specialized" : " runtime_tables"));
            CK(cudaMemset(dout.p, 0, dout.n * sizeof(float)));
            cuda::packed_decode_attention(plan, db, dpool.p, dq.p, DType::f32, 0.125f, dout.p, ws.p, ws_bytes,
                                          n_splits, nullptr, variant);
            CK(cudaDeviceSynchronize());
            const std::vector<float> out = dout.get();
            for (int r = 0; r < hq; ++r) {
              int n_finite = 0;
              for (int c = 0; c < d; ++c) n_finite += std::isfinite(out[(size_t)r * d + c]);
              if (r / gqa == 1 && bad_t < T)
                EXPECT_EQ(n_finite, 0) << "row " << r << " reads the KV head with the non-finite norm";
              else
                EXPECT_EQ(n_finite, d) << "row " << r;
            }
          }
        }
      }
  }
}

// Peaked attention against the named CPU reference: every token of a KV head
// has the same key codes and key norm 1 except one sink token (key norm N0),
// and each query row is scaled so that its score of a norm-1 token is exactly
// 1 (computed here as the reference does: Π q on the key group's channels,
// times the levels of the shared codes), so the sink stands (N0 − 1) nats above
// 4095 (999) other tokens: 10 to 33 log2 units, from the rest carrying most of
// the mass to none — where a per-page scale of P by the norms alone left the
// small weights a few int8 steps. The int8 kernels' P·V must stay within 1e-3
// of PackedRounding::int8_levels as on flat attention; runtime_tables within
// 1e-3 of fp16. Uniform K2V2 and K3V3 (the uniform instance) and a 3-bit key
// group with three value groups of 4, 1 and 2 bits (the general int8
// instance: a P scale per value group). One split (64 pages in one warp) and
// the default.
TEST(CudaPackedDecode, PeakedAttentionWithSinkToken) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (const int kind : {2, 3, 0}) {  // uniform bits, or 0: Special::value_groups (3-bit keys)
    const int bits = kind > 0 ? kind : 3;
    std::mt19937 rng(77 + kind);
    const int d = 128, hkv = 2, gqa = 4, hq = hkv * gqa;
    PackedTestPlan P = make_plan(d, hkv, false, bits, bits, rng, kind > 0 ? Special::none : Special::value_groups);
    const LayerLayout& L = *P.layout;
    cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
    ASSERT_EQ(cuda::packed_decode_kernel_name(plan, cuda::PackedDecodeVariant::specialized),
              kind > 0 ? "GQA<=8 uniform int8, " + std::to_string(bits) + " bits" : std::string("GQA<=8 general int8"));
    const ref::PackedPlan rplan = P.ref(hq);
    TestBatch B = make_batch({4096, 1000}, rng);
    const int nb = (int)B.lens.size();
    std::vector<std::vector<uint8_t>> kcodes(hkv, std::vector<uint8_t>(d));
    for (auto& c : kcodes)
      for (auto& x : c) x = (uint8_t)(rng() % (1u << bits));
    std::normal_distribution<float> N;
    std::vector<float> q((size_t)nb * hq * d);
    for (auto& x : q) x = N(rng);
    const float scale = 1.f / std::sqrt((float)d);
    // Score of a norm-1 token: s = scale · Σ_j (Π q[ch])_j · L[c_j] (the key group's
    // rotated domain); row q ← q / s makes it 1.
    for (int b = 0; b < nb; ++b)
      for (int hr = 0; hr < hq; ++hr) {
        const int h = hr / gqa;
        const std::span<const float> R = rplan.rotation(h, Side::key, 0), lv = rplan.levels(h, Side::key, 0);
        const std::vector<int>& ch = L.spec(h).key[0].channels;
        float* qr = q.data() + ((size_t)b * hq + hr) * d;
        double sc = 0;
        for (int j = 0; j < d; ++j) {
          double acc = 0;
          for (int i = 0; i < d; ++i) acc += (double)R[(size_t)j * d + i] * qr[ch[i]];
          sc += scale * acc * lv[kcodes[h][j]];
        }
        ASSERT_GT(std::fabs(sc), 1e-3);
        for (int c = 0; c < d; ++c) qr[c] = (float)(qr[c] / sc);
      }
    for (const float n0 : {8.f, 12.f, 16.f, 24.f}) {
      HostPagePool pool{&L, random_pages(L, B.n_pages, rng)};
      for (int b = 0; b < nb; ++b)
        for (int t = 0; t < B.lens[b]; ++t) {
          const auto page = pool.page(B.page_table[(size_t)b * B.max_pages + t / kPageTokens]);
          for (int h = 0; h < hkv; ++h) {
            write_codes(L, page, h, Side::key, 0, t % kPageTokens, kcodes[h]);
            write_norm(L, page, h, Side::key, 0, t % kPageTokens, fp32_to_fp16(t == 5 ? n0 : 1.f));
          }
        }
      DevBuf<uint8_t> dpool(pool.bytes);
      DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
      cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len};
      {
        const std::vector<float> want8 =
            ref::packed_decode_attention(rplan, B.ref(), pool.bytes, {}, q, scale, ref::PackedRounding::int8_levels);
        const std::vector<float> want16 =
            ref::packed_decode_attention(rplan, B.ref(), pool.bytes, {}, q, scale, ref::PackedRounding::fp16);
        DevBuf<float> dq(q), dout((size_t)nb * hq * d);
        for (const int splits : {1, 0}) {
          const int n_splits = splits > 0 ? splits : cuda::default_splits(plan, nb, B.max_len);
          const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, d, n_splits);
          DevBuf<uint8_t> ws(ws_bytes);
          for (auto variant : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables}) {
            const bool spec = variant == cuda::PackedDecodeVariant::specialized;
            CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
            CK(cudaMemset(ws.p, 0xff, ws_bytes));  // a state or query row nobody writes reads as NaN
            cuda::packed_decode_attention(plan, db, dpool.p, dq.p, DType::f32, scale, dout.p, ws.p, ws_bytes,
                                          n_splits, nullptr, variant);
            CK(cudaDeviceSynchronize());
            const std::vector<float> out = dout.get();
            for (int b = 0; b < nb; ++b) {
              const size_t n = (size_t)hq * d;
              const double e = rel_err(out, spec ? want8 : want16, (size_t)b * n, n);
              EXPECT_LT(e, 1e-3) << (kind > 0 ? "uniform bits " : "value groups, key bits ") << bits << " N0 " << n0 << " splits " << n_splits
                                 << (spec ? " specialized" : " runtime_tables") << " sequence " << b;
              if (b == 0)
                std::printf("  peaked %s %d N0 %4.0f (sink %4.1f log2 units above) splits %3d %-14s rel err %.2e\n",
                            kind > 0 ? "bits" : "value groups, key bits", bits, n0, (n0 - 1) * 1.4426950408889634, n_splits, spec ? "specialized" : "runtime_tables", e);
            }
          }
        }
      }
    }
  }
}

// Small cases of the two tests below (also the compute-sanitizer cases).
TEST(CudaPackedDecode, SmallZeroBit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_packed_case({64, 3, 4, {1, 97, 130}, false, 0, 0, DType::f32, Special::zero_bit}, 690);
}
TEST(CudaPackedDecode, SmallWide) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_packed_case({64, 2, 3, {1, 97, 130}, false, 0, 0, DType::f32, Special::wide}, 790);
}

// Several key and value groups of 1, 2 and 4 bits per head, padded groups with
// odd tile counts (Special::groups): the general int8 instance's per-group key
// products (a zero query part beside an odd last tile) and per-group value
// scales (specialized) and the general fp16 one (runtime_tables); the same key
// groups with one value group over the head of 1..4 bits (Special::key_groups,
// KV heads of different value widths: the instance with compile-time value
// tiles); GQA 1/3/4/7/8 and 12 (the 16-row kernel), head_dim 64/128/256, one
// CTA's splits and more, against the CPU reference (int8_levels and fp16
// rounding respectively).
TEST(CudaPackedDecode, SeveralGroupsPerSide) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {64, 2, 4, {1, 97, 130}, false, 0, 0, DType::f32, Special::groups, nullptr, {0, 1, 9}},
      {128, 3, 7, {97, 1, 4096}, false, 0, 0, DType::f16, Special::groups, nullptr, {0, 3, 17}},
      {128, 2, 8, {700, 64, 65}, false, 0, 0, DType::f32, Special::groups},
      {256, 2, 3, {1, 97, 1000}, false, 0, 0, DType::f32, Special::groups, nullptr, {0, 4, 5}},
      {128, 1, 1, {5000, 33}, false, 0, 0, DType::f16, Special::groups},
      {64, 2, 12, {97, 300}, false, 0, 0, DType::f32, Special::groups},
      {128, 4, 4, {1, 97, 4096}, false, 0, 0, DType::f16, Special::key_groups, nullptr, {0, 1, 9}},
      {64, 4, 8, {130, 1}, false, 0, 0, DType::f32, Special::key_groups},
      {256, 4, 3, {97, 700}, false, 0, 0, DType::f32, Special::key_groups, nullptr, {0, 5}},
  };
  uint32_t seed = 2100;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

// A narrow key group beside wide ones: key group 1 (4 bits) with codebook
// levels ÷ 64 and norms × 64 (the same keys; its int8 codebook scale ρ ≈
// 1/44 … 1/53 of the head's largest, by head_dim). The general int8
// instances put ρ into that group's int8 query tiles (docs/design.md §8),
// which keeps ≈ 15 − log2(1/ρ) ≈ 9 of the query's bits there; the CPU
// reference keeps the fp32 query. Both general int8 instances, head_dim
// 64/128/256, GQA 3/4/8.
TEST(CudaPackedDecode, NarrowKeyGroup) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const float r = 1.f / 64;
  const Case cases[] = {
      {128, 4, 4, {1, 97, 4096}, false, 0, 0, DType::f16, Special::key_groups, nullptr, {0, 9}, r},
      {64, 2, 8, {130, 1}, false, 0, 0, DType::f32, Special::key_groups, nullptr, {}, r},
      {128, 3, 3, {97, 1, 700}, false, 0, 0, DType::f32, Special::groups, nullptr, {0, 3}, r},
      {256, 2, 4, {1, 97, 300}, false, 0, 0, DType::f32, Special::groups, nullptr, {}, r},
  };
  uint32_t seed = 2200;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

// Sides with no groups and 0-bit channels (docs/packed_format.md §6): scores 0
// for a KV head without key groups, output 0 on channels in no value group;
// the general int8 instance (specialized, GQA ≤ 8), the general fp16 one
// (runtime_tables) and the 16-row kernel (GQA 12).
TEST(CudaPackedDecode, ZeroBitSides) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {64, 3, 4, {1, 97, 4096}, false, 0, 0, DType::f32, Special::zero_bit},
      {128, 3, 8, {97, 1, 300}, false, 0, 0, DType::f16, Special::zero_bit},
      {256, 3, 1, {4096, 1}, false, 0, 0, DType::f32, Special::zero_bit},
      {64, 3, 12, {97, 65}, false, 0, 0, DType::f32, Special::zero_bit},
  };
  uint32_t seed = 700;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

// Groups of 5..8 bits (low nibble in the pages, high bits in the extension
// pages, docs/packed_format.md §5) on the generic kernel.
TEST(CudaPackedDecode, WideGroups) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {64, 2, 4, {1, 97, 4096}, false, 0, 0, DType::f32, Special::wide},
      {128, 3, 8, {97, 1, 130}, false, 0, 0, DType::f16, Special::wide},
      {256, 1, 1, {97, 1}, false, 0, 0, DType::f32, Special::wide},
      {128, 2, 16, {200}, false, 0, 0, DType::f32, Special::wide},
  };
  uint32_t seed = 800;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

TEST(CudaPackedDecode, WidePlanErrors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 rng(5);
  PackedTestPlan P = make_plan(64, 2, false, 0, 0, rng, Special::wide);
  cuda::PackedPlan plan(*P.layout, *P.ext, 4, P.rot, P.lvl);
  ASSERT_NE(plan.ext_layout(), nullptr);
  DevBuf<int32_t> dpt(std::vector<int32_t>{0}), dlen(std::vector<int32_t>{0});
  DevBuf<uint8_t> pool(P.layout->page_bytes());
  DevBuf<float> x(2 * 64);
  cuda::DecodeBatch db{dpt.p, 1, dlen.p, 1, 64};
  // The GPU quantizers do not write extension pages.
  EXPECT_THROW(cuda::packed_append(plan, db, pool.p, x.p, x.p, DType::f32, nullptr), ratekv::Error);
  EXPECT_THROW(cuda::packed_prefill(plan, db, pool.p, x.p, x.p, 1, DType::f32, nullptr), ratekv::Error);
  // Without the extension layout the levels do not fit (2^b per wide group).
  EXPECT_THROW(cuda::PackedPlan(*P.layout, 4, P.rot, P.lvl), ratekv::Error);
  // An extension layout of another head_dim / head count.
  const LayerLayout other = LayerLayout::uniform(64, 1, 2, 2);
  EXPECT_THROW(cuda::PackedPlan(*P.layout, other, 4, P.rot, P.lvl), ratekv::Error);
}

// ---- fp16 baseline kernel ---------------------------------------------------

TEST(CudaFp16Decode, AgainstReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  struct C {
    int d, hkv, gqa;
    std::vector<int> lens;
  };
  // The last case is past one wave of the n8 kernel (40 · 8 = 320 rows: its
  // wave bound gives 3 splits, fp16_default_splits 4, merged in the kernel).
  std::vector<int> many(40);
  for (int i = 0; i < 40; ++i) many[i] = 64 + 37 * i % 250;
  const C cases[] = {{64, 3, 8, {1, 97, 4096}},
                     {128, 2, 4, {100003, 1, 97, 4096, 5, 16, 17, 300}},
                     {128, 4, 7, {33, 4097, 1000}},
                     {256, 1, 1, {97}},
                     {64, 1, 12, {130, 7}},
                     {128, 8, 4, many}};
  // The automatic choice at fixed points: merge in the kernel up to 32
  // splits (GQA ≤ 8), not at 33 or for GQA > 8; n8_fused always, n8 never.
  EXPECT_TRUE(cuda::fp16_fused_merge(4, 32, cuda::Fp16DecodeVariant::automatic));
  EXPECT_FALSE(cuda::fp16_fused_merge(4, 33, cuda::Fp16DecodeVariant::automatic));
  EXPECT_FALSE(cuda::fp16_fused_merge(12, 4, cuda::Fp16DecodeVariant::automatic));
  EXPECT_TRUE(cuda::fp16_fused_merge(8, 200, cuda::Fp16DecodeVariant::n8_fused));
  EXPECT_FALSE(cuda::fp16_fused_merge(8, 2, cuda::Fp16DecodeVariant::n8));
  // fp16_default_splits past one wave: ≥ 4 (the CTA's warps) with ≥ 8 tiles
  // (B = 40, 8 KV heads on 132 SMs: the wave bound alone gives 3); 1 tile: 1.
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (sms == 132) {
    EXPECT_EQ(cuda::fp16_default_splits(40, 8, 32, 128, 300), 4);
    EXPECT_EQ(cuda::fp16_default_splits(40, 8, 32, 128, 16), 1);
  }
  uint32_t seed = 7;
  using V = cuda::Fp16DecodeVariant;
  const std::pair<V, const char*> variants[] = {
      {V::rows16, "rows16"}, {V::n8, "n8"}, {V::n8_fused, "n8_fused"}, {V::automatic, "automatic"}};
  // Every kernel (the GQA ≤ 8 ones reject GQA 12, which only rows16 and
  // automatic run) at the generic default split count and, for the n8 kernel
  // with and without the in-kernel merge, at 3 splits (a CTA with a warp past
  // the last split), 33 (automatic: the separate merge; more splits than
  // tiles for the short sequences: empty splits weigh 0) and 1; one batch
  // and reference per case.
  for (const C& c : cases) {
    std::mt19937 rng(seed++);
    TestBatch B = make_batch(c.lens, rng);
    const int hq = c.hkv * c.gqa, nb = (int)c.lens.size();
    const size_t page_elems = (size_t)c.hkv * 2 * kPageTokens * c.d;
    std::normal_distribution<float> N;
    std::vector<uint16_t> pool((size_t)B.n_pages * page_elems);
    for (auto& x : pool) x = fp32_to_fp16(N(rng));
    std::vector<float> q((size_t)nb * hq * c.d);
    for (auto& x : q) x = N(rng);
    const float scale = 1.f / std::sqrt((float)c.d);
    DevBuf<uint16_t> dpool(pool);
    DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
    DevBuf<float> dq(q), dout((size_t)nb * hq * c.d);
    const std::vector<float> reference = ref::fp16_decode_attention(hq, c.hkv, c.d, B.ref(), pool, q, scale);
    cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len};
    for (const auto& [var, vname] : variants)
    for (const int split_case : {0, 1, 3, 33, -1}) {
      const bool n8_kernel = var == V::n8 || var == V::n8_fused || (var == V::automatic && c.gqa <= 8);
      if ((var == V::n8 || var == V::n8_fused) && c.gqa > 8) continue;
      if (split_case > 0 && !n8_kernel) continue;
      // -1: n_splits = 0, the kernel's own fp16_default_splits (workspace sized for it).
      const int splits = split_case > 0    ? split_case
                         : split_case == 0 ? cuda::default_splits(nb, c.hkv, B.max_len)
                                           : cuda::fp16_default_splits(nb, c.hkv, hq, c.d, B.max_len, var);
      SCOPED_TRACE("d=" + std::to_string(c.d) + " gqa=" + std::to_string(c.gqa) + " " + vname + " splits " +
                   std::to_string(splits) +
                   (n8_kernel && cuda::fp16_fused_merge(c.gqa, splits, var) ? " (fused merge)" : ""));
      const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, c.d, splits);
      DevBuf<uint8_t> ws(ws_bytes);
      // Garbage in the workspace (the fused merge's arrival counters must be
      // zeroed by the call itself), and a second call on the same workspace
      // (a CUDA graph replay's situation) must give the same rows.
      CK(cudaMemset(ws.p, 0x5a, ws_bytes));
      for (int call = 0; call < 2; ++call) {
        CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));
        cuda::fp16_decode_attention(hq, c.hkv, c.d, db, dpool.p, dq.p, DType::f32, scale, dout.p,
                                    ws.p, ws_bytes, split_case < 0 ? 0 : splits, nullptr, var);
        CK(cudaDeviceSynchronize());
        const auto out = dout.get();
        for (int b = 0; b < nb; ++b) {
          const size_t n = (size_t)hq * c.d;
          EXPECT_LT(rel_err(out, reference, (size_t)b * n, n), 1e-3) << "sequence " << b << " call " << call;
        }
      }
    }
  }
}

// ---- quantize-append and quantize-prefill ---------------------------------------

// The GPU's pages (gpu) against the reference quantizer's (expect, written by
// ref::packed_append / packed_prefill over the same starting bytes): for every
// written token (sequence b, input token i at position starts[b] + i) every
// code equals the reference's, except where y/‖x‖ lies within max_margin of a
// midpoint (fp32 kernels: 1e-5, the GPU sums Π x in fp32, the reference in
// double; the tensor-core prefill: Π in fp16 / TF32, see run_prefill_case),
// and then only by one level; the fp16 norms agree to 1e-3. The GPU's codes
// and norms are then copied into expect, so that expect == gpu checks the bit
// placement and that nothing else changed.
// k, v: (batch, n_tokens, n_kv_heads, head_dim). Returns the codes that differ.
int compare_written_tokens(const ref::PackedPlan& plan, const TestBatch& B, const std::vector<int>& starts,
                           int n_tokens, const std::vector<float>& k, const std::vector<float>& v,
                           const HostPagePool& gpu, HostPagePool& expect, double max_margin = 1e-5) {
  const LayerLayout& L = plan.layout();
  const int hkv = L.n_kv_heads(), d = L.head_dim();
  int ties = 0;
  for (int b = 0; b < (int)starts.size(); ++b)
    for (int i = 0; i < n_tokens; ++i) {
      const int pos = starts[b] + i;
      const int page = B.page_table[(size_t)b * B.max_pages + pos / kPageTokens];
      const int slot = pos % kPageTokens;
      for (int h = 0; h < hkv; ++h)
        for (int s = 0; s < 2; ++s) {
          const Side side = s == 0 ? Side::key : Side::value;
          const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
          for (int g = 0; g < (int)specs.size(); ++g) {
            const int m = (int)specs[g].channels.size();
            std::vector<uint8_t> got(m), want(m);
            read_codes(L, gpu.page(page), h, side, g, slot, got);
            read_codes(L, std::as_const(expect).page(page), h, side, g, slot, want);
            if (got != want) {
              const float* x = (s == 0 ? k : v).data() + (((size_t)b * n_tokens + i) * hkv + h) * d;
              std::vector<float> xg(m);
              for (int j = 0; j < m; ++j) xg[j] = x[specs[g].channels[j]];
              const ref::TqMseCode rc = ref::tq_mse_encode(plan.rotation(h, side, g), plan.levels(h, side, g), xg);
              for (int j = 0; j < m; ++j)
                if (got[j] != want[j]) {
                  ++ties;
                  EXPECT_LT(rc.margin[j], max_margin) << "b " << b << " token " << i << " h " << h << " side " << s
                                                      << " group " << g << " coord " << j << ": GPU code "
                                                      << (int)got[j] << ", reference " << (int)want[j];
                  EXPECT_EQ(std::abs((int)got[j] - (int)want[j]), 1) << "b " << b << " token " << i << " coord " << j;
                }
            }
            const uint16_t gn = read_norm(L, gpu.page(page), h, side, g, slot);
            const float rn = fp16_to_fp32(read_norm(L, std::as_const(expect).page(page), h, side, g, slot));
            EXPECT_NEAR(fp16_to_fp32(gn), rn, std::abs(rn) * 1e-3);
            write_codes(L, expect.page(page), h, side, g, slot, got);
            write_norm(L, expect.page(page), h, side, g, slot, gn);
          }
        }
    }
  return ties;
}

TEST(CudaPackedAppend, MatchesReferenceQuantizerAndTouchesOnlyItsToken) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (int d : {64, 128, 256}) {
    SCOPED_TRACE("d=" + std::to_string(d));
    std::mt19937 rng(300 + d);
    const int hkv = 2, hq = 4;
    PackedTestPlan P = make_plan(d, hkv, d != 256, 3, 2, rng);
    const LayerLayout& L = *P.layout;
    const std::vector<int> pos = {0, 97, 4095, 63};
    const int nb = (int)pos.size();
    TestBatch B = make_batch(pos, rng, 1);
    HostPagePool pool{&L, std::vector<uint8_t>((size_t)B.n_pages * L.page_bytes())};
    for (auto& x : pool.bytes) x = (uint8_t)rng();
    const std::vector<uint8_t> before = pool.bytes;
    std::normal_distribution<float> N;
    std::vector<float> k((size_t)nb * hkv * d), v(k.size());
    for (auto& x : k) x = 3.f * N(rng);
    for (auto& x : v) x = N(rng);
    cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
    DevBuf<uint8_t> dpool(pool.bytes);
    DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
    DevBuf<float> dk(k), dv(v);
    cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len + 1};
    cuda::packed_append(plan, db, dpool.p, dk.p, dv.p, DType::f32, nullptr);
    CK(cudaDeviceSynchronize());
    const auto after = dpool.get();
    HostPagePool gpu{&L, after};
    HostPagePool expect{&L, before};
    const ref::PackedPlan rplan = P.ref(hq);
    ref::packed_append(rplan, B.ref(), expect.bytes, k, v);
    EXPECT_LE(compare_written_tokens(rplan, B, pos, 1, k, v, gpu, expect), 2);
    // Bit placement equals the reference writer's, and nothing else changed.
    EXPECT_TRUE(expect.bytes == after);
  }
}

// n_tokens vectors per sequence written from position starts[b] (not page-aligned,
// crossing pages), in both variants from the same starting bytes: the norms are
// fp16(‖x_g‖), the bytes equal the reference writer's output with the GPU's
// codes, nothing outside the written tokens changed, and the codes equal the
// reference quantizer's (ref::packed_prefill, double) except
//  fp32: at a midpoint tie (|y/‖x‖ − μ| < 1e-5; ≤ 1 + 1e-5 of the codes);
//  tensor_cores: where rounding Π to fp16 (fp16 inputs) or Π and x to TF32
//    (fp32 inputs) can cross a midpoint. Per coordinate |Δ(y_j/‖x‖)| ≤
//    u·Σ_i |Π_ji x_i|/‖x‖ ≤ u·‖Π_j‖ = u for the fp16 operand (u = 2^-11), and
//    ≤ 2u + u² with both operands rounded (TF32 rounds to 10 mantissa bits,
//    u = 2^-11; 2^-10 allowed in case the library truncates): bound 5.5e-4
//    (fp16) / 2.1e-3 (fp32); such a code is one level off. The typical error
//    is ~u/√(3m), so flips are rare: at most 1 % of the codes (+1).
// A third pass runs tensor_cores with a cuda::PrefillScratch (the caller's
// cuBLAS handle on its own stream, a 64-row buffer: every prompt longer than
// 64 tokens in chunks) and a plan holding only the prefill matrix of the
// input's dtype (what the GPU engine does), under the same bound.
void run_prefill_case(int d, bool mixed, DType dtype, const std::vector<int>& starts, int n_tokens,
                      uint32_t seed, Special sp = Special::none) {
  SCOPED_TRACE("d=" + std::to_string(d) + (mixed ? " mixed" : " uniform K3V2") +
               (dtype == DType::f16 ? " f16" : " f32") + " n_tokens=" + std::to_string(n_tokens) +
               (sp == Special::zero_bit ? " zero-bit sides" : ""));
  std::mt19937 rng(seed);
  const int hkv = sp == Special::zero_bit ? 3 : 2, hq = 2 * hkv;
  PackedTestPlan P = make_plan(d, hkv, mixed, 3, 2, rng, sp);
  const LayerLayout& L = *P.layout;
  const int nb = (int)starts.size();
  TestBatch B = make_batch(starts, rng, n_tokens);
  HostPagePool pool{&L, std::vector<uint8_t>((size_t)B.n_pages * L.page_bytes())};
  for (auto& x : pool.bytes) x = (uint8_t)rng();
  const std::vector<uint8_t> before = pool.bytes;
  std::normal_distribution<float> N;
  const size_t n_el = (size_t)nb * n_tokens * hkv * d;
  std::vector<float> k(n_el), v(n_el);
  for (auto& x : k) x = 3.f * N(rng);
  for (auto& x : v) x = N(rng);
  std::vector<uint16_t> k16(n_el), v16(n_el);
  for (size_t i = 0; i < n_el; ++i) {
    k16[i] = fp32_to_fp16(k[i]);
    v16[i] = fp32_to_fp16(v[i]);
    if (dtype == DType::f16) {
      k[i] = fp16_to_fp32(k16[i]);
      v[i] = fp16_to_fp32(v16[i]);
    }
  }
  cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
  DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
  DevBuf<float> dk(k), dv(v);
  DevBuf<uint16_t> dk16(k16), dv16(v16);
  cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len + n_tokens};
  const ref::PackedPlan rplan = P.ref(hq);
  HostPagePool reference{&L, before};
  ref::packed_prefill(rplan, B.ref(), reference.bytes, k, v, n_tokens);
  const int checked = nb * n_tokens * hkv * 2 * d;
  // The scratch pass's resources.
  const cuda::PackedPlan plan1(L, hq, P.rot, P.lvl,
                               dtype == DType::f16 ? cuda::PrefillMatrices::f16 : cuda::PrefillMatrices::f32);
  cudaStream_t st = nullptr;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  DevBuf<uint8_t> blas_ws(size_t{4} << 20), rows(cuda::prefill_scratch_bytes(hkv, d, 64));
  ASSERT_EQ(cublasSetStream(h, st), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetWorkspace(h, blas_ws.p, blas_ws.n), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(rows.n, size_t{64} * 2 * hkv * d * 4);
  const cuda::PrefillScratch scratch{h, rows.p, rows.n};
  for (int pass = 0; pass < 3; ++pass) {
    const auto var = pass == 0 ? cuda::PrefillVariant::fp32 : cuda::PrefillVariant::tensor_cores;
    const bool tc = var == cuda::PrefillVariant::tensor_cores;
    SCOPED_TRACE(pass == 0 ? "fp32" : pass == 1 ? "tensor_cores" : "tensor_cores with scratch");
    DevBuf<uint8_t> dpool(before);
    const void* kp = dtype == DType::f16 ? (const void*)dk16.p : dk.p;
    const void* vp = dtype == DType::f16 ? (const void*)dv16.p : dv.p;
    if (pass < 2)
      cuda::packed_prefill(plan, db, dpool.p, kp, vp, n_tokens, dtype, nullptr, var);
    else
      cuda::packed_prefill(plan1, db, dpool.p, kp, vp, n_tokens, dtype, st, var, &scratch);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    const auto after = dpool.get();
    HostPagePool gpu{&L, after};
    HostPagePool expect = reference;
    const double max_margin = !tc ? 1e-5 : dtype == DType::f16 ? 5.5e-4 : 2.1e-3;
    const int diff = compare_written_tokens(rplan, B, starts, n_tokens, k, v, gpu, expect, max_margin);
    std::printf("  prefill %s d=%d n=%d: %d of %d codes differ from the reference (%.2e)\n",
                tc ? "tensor_cores" : "fp32", d, n_tokens, diff, checked, (double)diff / checked);
    EXPECT_LE(diff, tc ? 1 + checked / 100 : 1 + checked / 100000);
    EXPECT_TRUE(expect.bytes == after) << "bytes outside the prefilled tokens changed, or bit placement differs";
  }
  cublasDestroy(h);
  CK(cudaStreamDestroy(st));
}

TEST(CudaPackedPrefill, MatchesReferenceQuantizerAndTouchesOnlyItsTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_prefill_case(64, true, DType::f32, {0, 97, 5, 64}, 130, 500);
  run_prefill_case(128, true, DType::f16, {3, 0}, 200, 501);
  run_prefill_case(128, false, DType::f32, {0}, 1, 502);
  run_prefill_case(256, false, DType::f32, {61, 0}, 70, 503);
  run_prefill_case(128, false, DType::f16, {7}, 97, 504);
  // Heads without key groups, without value groups, and with 0-bit channels
  // (the dense GEMM matrix has zero rows / unused columns there).
  run_prefill_case(64, false, DType::f32, {0, 33}, 90, 507, Special::zero_bit);
}

// Prompts beyond the tensor-core variant's 64 MiB workspace (d 64, 2 KV heads:
// 65536 rows) run in chunks: whole sequences per chunk (2 × 40000 tokens) and
// 64-token multiples of one sequence (70000 tokens from position 5: the chunk
// boundary falls inside a page that two chunks share).
TEST(CudaPackedPrefill, LongPromptsInChunks) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_prefill_case(64, false, DType::f16, {0, 3}, 40000, 505);
  run_prefill_case(64, true, DType::f16, {5}, 70000, 506);
}

TEST(CudaPackedPrefill, RejectsBadArguments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 rng(9);
  PackedTestPlan P = make_plan(64, 1, false, 2, 2, rng);
  cuda::PackedPlan plan(*P.layout, 1, P.rot, P.lvl);
  DevBuf<int32_t> dpt(std::vector<int32_t>{0}), dlen(std::vector<int32_t>{0});
  DevBuf<uint8_t> pool(P.layout->page_bytes());
  DevBuf<float> x(64);
  cuda::DecodeBatch db{dpt.p, 1, dlen.p, 1, 64};
  EXPECT_THROW(cuda::packed_prefill(plan, db, pool.p, x.p, x.p, 0, DType::f32, nullptr), ratekv::Error);
  EXPECT_THROW(cuda::packed_prefill(plan, db, pool.p, nullptr, x.p, 1, DType::f32, nullptr), ratekv::Error);
  // A plan without the matrix of the input's dtype; a scratch buffer under 64
  // rows (for a longer prompt); a scratch handle bound to another stream.
  const cuda::PackedPlan p16(*P.layout, 1, P.rot, P.lvl, cuda::PrefillMatrices::f16);
  EXPECT_THROW(cuda::packed_prefill(p16, db, pool.p, x.p, x.p, 1, DType::f32, nullptr), ratekv::Error);
  const cuda::PackedPlan none(*P.layout, 1, P.rot, P.lvl, cuda::PrefillMatrices::none);
  EXPECT_EQ(none.device_bytes(), cuda::packed_plan_device_bytes(*P.layout, cuda::PrefillMatrices::none));
  EXPECT_EQ(p16.device_bytes(), cuda::packed_plan_device_bytes(*P.layout, cuda::PrefillMatrices::f16));
  EXPECT_EQ(plan.device_bytes(), cuda::packed_plan_device_bytes(*P.layout, cuda::PrefillMatrices::both));
  EXPECT_THROW(cuda::packed_prefill(none, db, pool.p, x.p, x.p, 1, DType::f32, nullptr), ratekv::Error);
  cudaStream_t st = nullptr;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(h, st), CUBLAS_STATUS_SUCCESS);
  DevBuf<uint8_t> small(cuda::prefill_scratch_bytes(1, 64, 64) - 1);
  DevBuf<int32_t> dpt2(std::vector<int32_t>{0, 1}), dlen2(std::vector<int32_t>{0});
  DevBuf<uint8_t> pool2(2 * P.layout->page_bytes());
  DevBuf<float> x2(100 * 64);
  const cuda::DecodeBatch db2{dpt2.p, 2, dlen2.p, 1, 100};
  const cuda::PrefillScratch too_small{h, small.p, small.n};
  EXPECT_THROW(cuda::packed_prefill(plan, db2, pool2.p, x2.p, x2.p, 100, DType::f32, st,
                                    cuda::PrefillVariant::tensor_cores, &too_small),
               ratekv::Error);
  DevBuf<uint8_t> enough(cuda::prefill_scratch_bytes(1, 64, 100));
  const cuda::PrefillScratch other_stream{h, enough.p, enough.n};
  EXPECT_THROW(cuda::packed_prefill(plan, db2, pool2.p, x2.p, x2.p, 100, DType::f32, nullptr,
                                    cuda::PrefillVariant::tensor_cores, &other_stream),
               ratekv::Error);
  CK(cudaStreamSynchronize(st));
  cublasDestroy(h);
  CK(cudaStreamDestroy(st));
}

TEST(CudaPackedPlan, RejectsUnsupportedCombinations) {
  const LayerLayout L96 = LayerLayout::uniform(96, 1, 2, 2);
  std::vector<float> rot(2 * 96 * 96, 0.f), lvl = {-1, -0.3f, 0.3f, 1, -1, -0.3f, 0.3f, 1};
  EXPECT_THROW(cuda::PackedPlan(L96, 4, rot, lvl), ratekv::Error);  // head_dim 96
  const LayerLayout L64 = LayerLayout::uniform(64, 1, 2, 2);
  rot.assign(2 * 64 * 64, 0.f);
  EXPECT_THROW(cuda::PackedPlan(L64, 3 * 17, rot, lvl), ratekv::Error);  // GQA 51
  std::vector<float> bad = lvl;
  bad[1] = -2.f;  // not ascending
  EXPECT_THROW(cuda::PackedPlan(L64, 4, rot, bad), ratekv::Error);
  rot.pop_back();
  EXPECT_THROW(cuda::PackedPlan(L64, 4, rot, lvl), ratekv::Error);  // wrong rotation size
}
