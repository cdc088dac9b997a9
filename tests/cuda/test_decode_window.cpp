// Sliding-window decode attention at the kernel level (cuda::DecodeBatch::window;
// the definition is the CPU runtime's, AttnParams::sliding_window in
// model/kv_cache.h, arithmetic in model/sliding_window.h): the query of
// sequence b (position seq_lens[b] − 1) sees keys t ≥ first_visible_key =
// max(0, seq_lens[b] − W) only.
//
// Every kernel that implements the window — the fp16 kernels (rows16, n8,
// n8_fused, automatic; 1 / 3 / 33 splits and the kernel's own default) and the
// packed GQA ≤ 8 kernels (uniform K4V4 / K3V3 / K2V2 in both variants, a
// mixed plan; GQA 1/4/8; head_dim 64/128/256) — against its named CPU
// reference with the window (ref::fp16_decode_attention /
// ref::packed_decode_attention with ref::DecodeBatch::window: plain loops over
// the visible keys, tested against the dense cache's sliding window and an
// independent decoded softmax in tests/ref), for W ∈ {1, 15, 16, 17, 48, 100}
// and 0 (no window), in one batch of unequal lengths per W:
//   1, 16, 17, 97, 130, 300, W, W + 1, and W + {47, 48, 49} / W + {63, 64, 65}
// (window start T − W just before, on and just after a 16-token tile and a
// 64-token page boundary).
//
// Bound: the non-window tests' (CudaFp16Decode.AgainstReference,
// CudaPackedDecode.*): relative L2 error < 1e-3 per sequence, on the same data
// distributions (N(0,1) fp16 K/V and queries; random codes, norms in
// [0.5, 2)). The kernels' unmodelled rounding (P rounded to fp16: ≤ 2^-11
// relative per weight; fp32 accumulation) is per term, so a window (a subset
// of the terms) keeps the same per-sequence bound.
// The test can fail when the window is ignored: wherever it cuts keys (T > W)
// the windowed reference differs from the unwindowed one by more than
// 10 × the bound (CudaDecodeWindow.ReferencesDifferWhereTheWindowCuts asserts
// it without a GPU; the GPU tests assert it again), and every page that lies
// wholly before the window's first page is filled with NaN (fp16 K/V rows;
// packed norms): the kernels must not read it (decode_attention.h: "pages
// before it are not read"), so a NaN in the output (rel_err = ∞) fails too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../support/cuda_test.h"
#include "../support/packed_plans.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/format/packed_vq_format.h"
#include "ratekv/model/sliding_window.h"
#include "ratekv/ref/fp16_decode_attention.h"
#include "ratekv/ref/packed_decode_attention.h"

using namespace ratekv;
using namespace ratekv::packed;
using namespace ratekv_test;
using ratekv::cuda::DType;

namespace {

constexpr double kBound = 1e-3;       // the non-window decode tests' bound (see the file comment)
constexpr double kCut = 10 * kBound;  // windowed vs unwindowed reference where the window cuts keys
constexpr int kWindows[] = {0, 1, 15, 16, 17, 48, 100};
constexpr uint16_t kNaN16 = 0x7e00;  // fp16 quiet NaN

/// The batch of one window W (see the file comment).
std::vector<int> lens_for(int W) {
  std::vector<int> lens = {1, 16, 17, 97, 130, 300};
  if (W > 0) lens.insert(lens.end(), {W, W + 1});
  for (int s : {47, 48, 49, 63, 64, 65}) lens.push_back(W + s);  // first visible key at s
  return lens;
}

/// Calls f(physical page) for every page of sequence b that lies wholly
/// before the page holding its first visible key.
template <typename F>
void for_pages_before_window(const TestBatch& B, int W, F&& f) {
  for (int b = 0; b < (int)B.lens.size(); ++b) {
    const int64_t first = first_visible_key(B.lens[b] - 1, W);
    for (int64_t i = 0; i < first / kPageTokens; ++i) f(B.page_table[(size_t)b * B.max_pages + i]);
  }
}

std::string lens_str(const std::vector<int32_t>& lens) {
  std::string s;
  for (int l : lens) s += std::to_string(l) + ",";
  return s;
}

/// Per sequence: the windowed reference equals the unwindowed one exactly
/// where the window holds every key, and differs by > kCut where it cuts.
void expect_cut(const std::vector<float>& windowed, const std::vector<float>& full, const TestBatch& B, int W,
                size_t row) {
  for (int b = 0; b < (int)B.lens.size(); ++b) {
    const size_t off = (size_t)b * row;
    if (W > 0 && B.lens[b] > W) {
      EXPECT_GT(rel_err(windowed, full, off, row), kCut)
          << "sequence " << b << " (length " << B.lens[b] << ", window " << W << ")";
    } else {
      EXPECT_TRUE(std::equal(windowed.begin() + off, windowed.begin() + off + row, full.begin() + off))
          << "sequence " << b << " (length " << B.lens[b] << ", window " << W << "): the window holds every key";
    }
  }
}

// ---- fp16 ------------------------------------------------------------------

struct Fp16Case {
  int d, hkv, gqa;
  DType q_dtype;
};

std::string name(const Fp16Case& c) {
  return "fp16 d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " gqa=" + std::to_string(c.gqa) +
         (c.q_dtype == DType::f16 ? " q f16" : " q f32");
}

/// Pages, queries and references of one (case, window).
struct Fp16Data {
  TestBatch B;
  std::vector<uint16_t> pool, q16;
  std::vector<float> q, windowed, full;
  float scale = 0;
};

Fp16Data fp16_data(const Fp16Case& c, int W, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp16Data D;
  D.B = make_batch(lens_for(W), rng);
  const int hq = c.hkv * c.gqa, nb = (int)D.B.lens.size();
  const size_t page_elems = (size_t)c.hkv * 2 * kPageTokens * c.d;
  std::normal_distribution<float> N;
  D.pool.resize((size_t)D.B.n_pages * page_elems);
  for (auto& x : D.pool) x = fp32_to_fp16(N(rng));
  D.q.resize((size_t)nb * hq * c.d);
  for (auto& x : D.q) x = N(rng);
  D.q16 = fp16_queries(D.q, c.q_dtype);
  D.scale = 1.f / std::sqrt((float)c.d);
  D.full = ref::fp16_decode_attention(hq, c.hkv, c.d, D.B.ref(), D.pool, D.q, D.scale);
  // Pages wholly before the window: NaN in every K and V row (not to be read).
  for_pages_before_window(D.B, W, [&](int p) {
    std::fill_n(D.pool.begin() + (size_t)p * page_elems, page_elems, kNaN16);
  });
  ref::DecodeBatch rb = D.B.ref();
  rb.window = W;
  D.windowed = ref::fp16_decode_attention(hq, c.hkv, c.d, rb, D.pool, D.q, D.scale);
  return D;
}

const Fp16Case kFp16Cases[] = {
    {64, 3, 8, DType::f32}, {128, 2, 4, DType::f16}, {256, 1, 1, DType::f32}, {128, 2, 7, DType::f32},
    {64, 1, 12, DType::f32},  // GQA > 8: rows16 only (automatic picks it)
};

void run_fp16_case(const Fp16Case& c, int W, uint32_t seed) {
  SCOPED_TRACE(name(c) + " window " + std::to_string(W));
  const Fp16Data D = fp16_data(c, W, seed);
  const TestBatch& B = D.B;
  SCOPED_TRACE("lens " + lens_str(B.lens));
  const int hq = c.hkv * c.gqa, nb = (int)B.lens.size();
  const size_t row = (size_t)hq * c.d;
  expect_cut(D.windowed, D.full, B, W, row);
  DevBuf<uint16_t> dpool(D.pool), dq16(D.q16);
  DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
  DevBuf<float> dq(D.q), dout((size_t)nb * hq * c.d);
  const void* qp = c.q_dtype == DType::f16 ? (const void*)dq16.p : (const void*)dq.p;
  cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len};
  db.window = W;
  // The split-K partition covers window_span_tokens(max_len, W, 16) tokens
  // (decode_attention.h); the kernel's own default split count is taken over them.
  const int span = (int)window_span_tokens(B.max_len, W, 16);
  using V = cuda::Fp16DecodeVariant;
  const std::pair<V, const char*> variants[] = {
      {V::rows16, "rows16"}, {V::n8, "n8"}, {V::n8_fused, "n8_fused"}, {V::automatic, "automatic"}};
  double worst = 0;
  for (const auto& [var, vname] : variants) {
    if ((var == V::n8 || var == V::n8_fused) && c.gqa > 8) continue;  // refused (GQA ≤ 8 kernels)
    for (const int n_splits : {0, 1, 3, 33}) {
      const int splits = n_splits > 0 ? n_splits : cuda::fp16_default_splits(nb, c.hkv, hq, c.d, span, var);
      const bool n8_kernel = var == V::n8 || var == V::n8_fused || (var == V::automatic && c.gqa <= 8);
      SCOPED_TRACE(std::string(vname) + " splits " + std::to_string(splits) + (n_splits == 0 ? " (default)" : "") +
                   (n8_kernel && cuda::fp16_fused_merge(c.gqa, splits, var) ? " (fused merge)" : ""));
      // Sized for the larger of the span's and max_len's default (the kernel
      // takes the span's; a workspace larger than needed is accepted).
      const int ws_splits = std::max(splits, cuda::fp16_default_splits(nb, c.hkv, hq, c.d, B.max_len, var));
      const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, c.d, ws_splits);
      DevBuf<uint8_t> ws(ws_bytes);
      CK(cudaMemset(ws.p, 0x5a, ws_bytes));  // garbage: the fused merge's counters are zeroed by the call
      CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
      cuda::fp16_decode_attention(hq, c.hkv, c.d, db, dpool.p, qp, c.q_dtype, D.scale, dout.p, ws.p, ws_bytes,
                                  n_splits, nullptr, var);
      CK(cudaDeviceSynchronize());
      const std::vector<float> out = dout.get();
      for (int b = 0; b < nb; ++b) {
        const double e = rel_err(out, D.windowed, (size_t)b * row, row);
        worst = std::max(worst, e);
        EXPECT_LT(e, kBound) << "sequence " << b << " (length " << B.lens[b] << ")";
      }
    }
  }
  std::printf("  %s window %d: worst rel err vs the windowed reference %.2e\n", name(c).c_str(), W, worst);
}

// ---- packed ------------------------------------------------------------------

struct PackedCase {
  int d, hkv, gqa;
  bool mixed;
  int kb, vb;
  DType q_dtype;
};

std::string name(const PackedCase& c) {
  return "packed d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " gqa=" + std::to_string(c.gqa) +
         (c.mixed ? " mixed" : " K" + std::to_string(c.kb) + "V" + std::to_string(c.vb)) +
         (c.q_dtype == DType::f16 ? " q f16" : " q f32");
}

struct PackedData {
  TestBatch B;
  std::vector<uint8_t> pool;
  std::vector<uint16_t> q16;
  std::vector<float> q, windowed, full;  // fp16-level reference (PackedRounding::fp16)
  float scale = 0;
};

/// The plan of a case (one per case: its Haar rotations are the costly part).
PackedTestPlan packed_plan(const PackedCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  return make_plan(c.d, c.hkv, c.mixed, c.kb, c.vb, rng);
}

PackedData packed_data(const PackedCase& c, const PackedTestPlan& P, int W, uint32_t seed) {
  std::mt19937 rng(seed);
  PackedData D;
  const LayerLayout& L = *P.layout;
  const int hq = c.hkv * c.gqa;
  D.B = make_batch(lens_for(W), rng);
  const int nb = (int)D.B.lens.size();
  D.pool = random_pages(L, D.B.n_pages, rng);  // every bit pattern a code; norms in [0.5, 2)
  std::normal_distribution<float> N;
  D.q.resize((size_t)nb * hq * c.d);
  for (auto& x : D.q) x = N(rng);
  D.q16 = fp16_queries(D.q, c.q_dtype);
  D.scale = 1.f / std::sqrt((float)c.d);
  const ref::PackedPlan rplan = P.ref(hq);
  D.full = ref::packed_decode_attention(rplan, D.B.ref(), D.pool, {}, D.q, D.scale, ref::PackedRounding::fp16);
  // Pages wholly before the window: NaN norms in every group and slot.
  HostPagePool hp{&L, std::move(D.pool)};
  for_pages_before_window(D.B, W, [&](int p) {
    for (int h = 0; h < L.n_kv_heads(); ++h)
      for (Side s : {Side::key, Side::value})
        for (int g = 0; g < (int)L.head(h).side(s).size(); ++g)
          for (int t = 0; t < kPageTokens; ++t) write_norm(L, hp.page(p), h, s, g, t, kNaN16);
  });
  D.pool = std::move(hp.bytes);
  ref::DecodeBatch rb = D.B.ref();
  rb.window = W;
  D.windowed = ref::packed_decode_attention(rplan, rb, D.pool, {}, D.q, D.scale, ref::PackedRounding::fp16);
  return D;
}

const PackedCase kPackedCases[] = {
    {64, 2, 4, false, 3, 3, DType::f32},  {128, 1, 8, false, 4, 4, DType::f16}, {256, 1, 1, false, 2, 2, DType::f32},
    {64, 3, 8, false, 2, 2, DType::f32},  {128, 2, 1, false, 4, 4, DType::f32}, {256, 2, 4, false, 3, 3, DType::f16},
    {128, 2, 4, true, 0, 0, DType::f32},  // mixed widths: general int8 (specialized) and fp16 (runtime_tables)
};

void run_packed_case(const PackedCase& c, const PackedTestPlan& P, const cuda::PackedPlan& plan, int W,
                     uint32_t seed) {
  SCOPED_TRACE(name(c) + " window " + std::to_string(W));
  const PackedData D = packed_data(c, P, W, seed);
  const TestBatch& B = D.B;
  SCOPED_TRACE("lens " + lens_str(B.lens));
  const int hq = c.hkv * c.gqa, nb = (int)B.lens.size();
  const size_t row = (size_t)hq * c.d;
  expect_cut(D.windowed, D.full, B, W, row);
  // The integer kernels' int8 key and value levels: their own reference (as CudaPackedDecode).
  const bool int8_levels = cuda::uses_int8_levels(plan, cuda::PackedDecodeVariant::specialized);
  std::vector<float> windowed8;
  if (int8_levels) {
    ref::DecodeBatch rb = B.ref();
    rb.window = W;
    windowed8 = ref::packed_decode_attention(P.ref(hq), rb, D.pool, {}, D.q, D.scale, ref::PackedRounding::int8_levels);
  }
  DevBuf<uint8_t> dpool(D.pool);
  DevBuf<uint16_t> dq16(D.q16);
  DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
  DevBuf<float> dq(D.q), dout((size_t)nb * hq * c.d);
  const void* qp = c.q_dtype == DType::f16 ? (const void*)dq16.p : (const void*)dq.p;
  cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len};
  db.window = W;
  const int span = (int)window_span_tokens(B.max_len, W, kPageTokens);  // what the dispatcher partitions
  double worst = 0;
  for (const auto variant : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables}) {
    const bool spec = variant == cuda::PackedDecodeVariant::specialized;
    const std::vector<float>& want = spec && int8_levels ? windowed8 : D.windowed;
    for (const int n_splits : {0, 1, 3, 33}) {
      const int splits = n_splits > 0 ? n_splits : cuda::default_splits(plan, nb, span);
      SCOPED_TRACE(std::string(spec ? "specialized" : "runtime_tables") + (spec && int8_levels ? " (int8 levels)" : "") +
                   " splits " + std::to_string(splits) + (n_splits == 0 ? " (default)" : ""));
      const int ws_splits = std::max(splits, cuda::default_splits(plan, nb, B.max_len));
      const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, c.d, ws_splits);
      DevBuf<uint8_t> ws(ws_bytes);
      CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
      cuda::packed_decode_attention(plan, db, dpool.p, qp, c.q_dtype, D.scale, dout.p, ws.p, ws_bytes, n_splits,
                                    nullptr, variant);
      CK(cudaDeviceSynchronize());
      const std::vector<float> out = dout.get();
      for (int b = 0; b < nb; ++b) {
        const double e = rel_err(out, want, (size_t)b * row, row);
        worst = std::max(worst, e);
        EXPECT_LT(e, kBound) << "sequence " << b << " (length " << B.lens[b] << ")";
      }
    }
  }
  std::printf("  %s window %d: worst rel err vs the windowed reference %.2e\n", name(c).c_str(), W, worst);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ratekv::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// The data of the GPU tests below, without a GPU: where a window cuts keys
// the windowed reference is > 10 × the kernels' bound away from the
// unwindowed one (and identical where it cuts none), so a kernel that ignored
// the window would fail them.
TEST(CudaDecodeWindow, ReferencesDifferWhereTheWindowCuts) {
  uint32_t seed = 1000;
  for (const Fp16Case& c : kFp16Cases)
    for (const int W : kWindows) {
      SCOPED_TRACE(name(c) + " window " + std::to_string(W));
      const Fp16Data D = fp16_data(c, W, seed++);
      expect_cut(D.windowed, D.full, D.B, W, (size_t)c.hkv * c.gqa * c.d);
    }
  seed = 2000;
  for (const PackedCase& c : kPackedCases) {
    const PackedTestPlan P = packed_plan(c, seed);
    for (const int W : kWindows) {
      SCOPED_TRACE(name(c) + " window " + std::to_string(W));
      const PackedData D = packed_data(c, P, W, seed + 1 + W);
      expect_cut(D.windowed, D.full, D.B, W, (size_t)c.hkv * c.gqa * c.d);
    }
    seed += 200;
  }
}

TEST(CudaDecodeWindow, Fp16KernelsAgainstWindowedReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  uint32_t seed = 1000;  // the data of ReferencesDifferWhereTheWindowCuts
  for (const Fp16Case& c : kFp16Cases)
    for (const int W : kWindows) run_fp16_case(c, W, seed++);
}

TEST(CudaDecodeWindow, PackedGqa8KernelsAgainstWindowedReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  uint32_t seed = 2000;  // the data of ReferencesDifferWhereTheWindowCuts
  for (const PackedCase& c : kPackedCases) {
    const PackedTestPlan P = packed_plan(c, seed);
    const cuda::PackedPlan plan(*P.layout, c.hkv * c.gqa, P.rot, P.lvl, cuda::PrefillMatrices::none);
    for (const int W : kWindows) run_packed_case(c, P, plan, W, seed + 1 + W);
    seed += 200;
  }
}

// The compute-sanitizer case (memcheck / racecheck, tools/device): the first
// fp16 and packed cases of the tests above at W = 17 and 100, with their data
// (same seeds), every variant and split count.
TEST(CudaDecodeWindow, Small) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const PackedCase& pc = kPackedCases[0];
  const PackedTestPlan P = packed_plan(pc, 2000);
  const cuda::PackedPlan plan(*P.layout, pc.hkv * pc.gqa, P.rot, P.lvl, cuda::PrefillMatrices::none);
  for (int wi = 0; wi < (int)std::size(kWindows); ++wi) {
    const int W = kWindows[wi];
    if (W != 17 && W != 100) continue;
    run_fp16_case(kFp16Cases[0], W, 1000 + wi);
    run_packed_case(pc, P, plan, W, 2000 + 1 + W);
  }
}

// Every kernel without a window refuses one before any work, naming `window`
// (decode_attention.h: packed GQA > 8, plans with 5..8-bit groups,
// vq_decode_attention); a negative window is refused by every decode entry
// point. The same calls with window 0 run.
TEST(CudaDecodeWindow, RefusalsNameTheWindow) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 rng(77);
  const int d = 64, T = 70;
  TestBatch B = make_batch({T}, rng);
  DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
  cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, 1, T};
  const int splits = 2;
  const size_t ws_bytes = cuda::decode_workspace_bytes(1, 16, d, splits);
  DevBuf<uint8_t> ws(ws_bytes);
  DevBuf<float> dq(std::vector<float>(16 * d, 0.25f)), dout(16 * d);
  const auto expect_refusal = [&](const std::function<void(const cuda::DecodeBatch&)>& call, const std::string& what) {
    SCOPED_TRACE(what);
    cuda::DecodeBatch w = db;
    w.window = 16;
    const std::string why = error_of([&] { call(w); });
    EXPECT_NE(why.find(what + ": window 16 (sliding-window attention) is not implemented"), std::string::npos)
        << "message: '" << why << "'";
    w.window = -1;
    const std::string neg = error_of([&] { call(w); });
    EXPECT_NE(neg.find("window -1 must be >= 0"), std::string::npos) << "message: '" << neg << "'";
    EXPECT_NO_THROW(call(db));  // window 0
    CK(cudaDeviceSynchronize());
  };
  {  // packed GQA 16 (16-row kernel)
    const PackedTestPlan P = make_plan(d, 1, false, 3, 3, rng);
    const cuda::PackedPlan plan(*P.layout, 16, P.rot, P.lvl, cuda::PrefillMatrices::none);
    DevBuf<uint8_t> pool(random_pages(*P.layout, B.n_pages, rng));
    expect_refusal(
        [&](const cuda::DecodeBatch& x) {
          cuda::packed_decode_attention(plan, x, pool.p, dq.p, DType::f32, 0.125f, dout.p, ws.p, ws_bytes, splits,
                                        nullptr);
        },
        "packed_decode_attention (GQA > 8)");
  }
  {  // 5..8-bit groups (generic kernel, extension pages)
    const PackedTestPlan P = make_plan(d, 2, false, 0, 0, rng, Special::wide);
    const cuda::PackedPlan plan(*P.layout, *P.ext, 4, P.rot, P.lvl);
    DevBuf<uint8_t> pool(random_pages(*P.layout, B.n_pages, rng));
    DevBuf<uint8_t> ext((size_t)B.n_pages * P.ext->page_bytes());
    CK(cudaMemset(ext.p, 0x33, ext.n));
    expect_refusal(
        [&](const cuda::DecodeBatch& x) {
          cuda::packed_decode_attention(plan, x, pool.p, ext.p, dq.p, DType::f32, 0.125f, dout.p, ws.p, ws_bytes,
                                        splits, nullptr);
        },
        "packed_decode_attention (a plan with 5..8-bit groups)");
  }
  {  // vq pages (TaSQ-like keys, fp16 values)
    const VqLayerLayout L(d, 1, {VqSideKind::vq, 8, 4, true}, {VqSideKind::fp16, 0, 0, false});
    std::vector<float> cw(8 * 16 * 8);
    std::normal_distribution<float> N;
    for (auto& x : cw) x = N(rng);
    std::vector<int32_t> ch(d);
    std::iota(ch.begin(), ch.end(), 0);
    const cuda::VqPlan plan(L, 2, cw, ch, cuda::VqRope{});
    std::vector<uint8_t> pages((size_t)B.n_pages * L.page_bytes());
    for (auto& x : pages) x = (uint8_t)(rng() & 0x3f);  // small fp16 scales / rows: finite
    DevBuf<uint8_t> pool(pages);
    expect_refusal(
        [&](const cuda::DecodeBatch& x) {
          cuda::vq_decode_attention(plan, x, pool.p, nullptr, dq.p, DType::f32, 0.125f, dout.p, ws.p, ws_bytes,
                                    splits, nullptr);
        },
        "vq_decode_attention");
  }
  // The kernels with a window refuse a negative one (check_batch).
  DevBuf<uint16_t> f16pool((size_t)B.n_pages * 2 * kPageTokens * d);
  CK(cudaMemset(f16pool.p, 0, f16pool.n * sizeof(uint16_t)));
  cuda::DecodeBatch neg = db;
  neg.window = -1;
  const std::string why = error_of([&] {
    cuda::fp16_decode_attention(4, 1, d, neg, f16pool.p, dq.p, DType::f32, 0.125f, dout.p, ws.p, ws_bytes, splits,
                                nullptr);
  });
  EXPECT_NE(why.find("fp16_decode_attention: window -1 must be >= 0"), std::string::npos) << why;
  const PackedTestPlan P = make_plan(d, 1, false, 2, 2, rng);
  const cuda::PackedPlan plan(*P.layout, 4, P.rot, P.lvl, cuda::PrefillMatrices::none);
  DevBuf<uint8_t> pool(random_pages(*P.layout, B.n_pages, rng));
  const std::string why2 = error_of([&] {
    cuda::packed_decode_attention(plan, neg, pool.p, dq.p, DType::f32, 0.125f, dout.p, ws.p, ws_bytes, splits,
                                  nullptr);
  });
  EXPECT_NE(why2.find("packed_decode_attention: window -1 must be >= 0"), std::string::npos) << why2;
}
