// Decode-attention benchmark on the GPU: packed-cache kernel (uniform K4V4,
// K3V3, K2V2 and a Block-GTQ-style mixed-width K3V3 layout) vs the fp16-cache
// kernel of the same structure, with the device-to-device copy ceiling and a
// read-only ceiling (cuda::read_probe: 16-byte loads, XOR-reduced, over 4 GiB;
// and over each point's packed pool, the same bytes the kernel reads)
// measured in the same run. The fp16 kernel is timed in its variants (rows16,
// n8 with the separate merge, n8_fused with the in-kernel merge) at
// fp16_default_splits and n8 also at ¼, ½, 2x and 4x those splits; the
// row "fp16" is what fp16_decode_attention picks by default, "fp16_best_ms"
// the fastest measured. Llama-3.1-8B (32 query / 8 KV heads) and
// Qwen2.5-3B (16 / 2) attention shapes, head_dim 128, B up to 32, T up to 512K.
// Time per decode step (one layer): CUDA events around the attention call
// only, median of N runs, L2 flushed (a 512 MB memset; --flush read: a 512 MB
// read) before each run; at T ≤ 32K also as a replayed CUDA graph. Also:
// quantize-append per token,
// prefill-quantize throughput (one launch per layer) and, with --demo, the
// 32-layer B=4 T=512K K3V3 memory demonstration. Writes JSON (--out FILE)
// and prints a table.
// The torch SDPA flash baseline runs in the same device call
// (tools/device/sdpa_baseline.py).
// Before any timing, every kernel timed here is checked against its named
// CPU reference (include/ratekv/ref/) on small batches of both shapes
// (lengths 4096, 1, 97; JSON "reference_check"); the program exits 1 when a
// kernel is off (rel err > 1e-3, or quantize-append codes other than the
// reference's beyond midpoint ties).
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ratekv/common/fp16.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/cuda/model_kernels.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/ref/fp16_decode_attention.h"
#include "ratekv/ref/packed_decode_attention.h"
#include "ratekv/ref/packed_quantize.h"

using namespace ratekv;
using namespace ratekv::packed;

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

constexpr int kD = 128;

/// Attention shapes of one model (one layer).
struct Shape {
  const char* model;
  int n_heads, n_kv_heads;
};
constexpr Shape kLlama{"llama-3.1-8b", 32, 8};
constexpr Shape kQwen{"qwen2.5-3b", 16, 2};

/// Timing with L2 flushed before every run. write_flush (the default, as in
/// every committed table): a 512 MB memset — the call then starts with L2 full
/// of dirty lines, whose write-back shares DRAM with the call's reads; read flush
/// (--flush read): cuda::read_probe over the same 512 MB — L2 left holding
/// clean lines, as after a decode step's weight-reading GEMMs.
struct Timer {
  void* flush = nullptr;
  size_t flush_bytes = 512ull << 20;
  bool write_flush = true;
  uint32_t* sink = nullptr;
  cudaEvent_t a, b;
  Timer() {
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMemset(flush, 1, flush_bytes));
    CK(cudaMalloc(&sink, sizeof(uint32_t)));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  void do_flush(int i, cudaStream_t s) {
    if (write_flush)
      CK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, s));
    else
      cuda::read_probe(flush, flush_bytes, sink, s);
  }
  /// Median of `reps` runs of f() captured once into a CUDA graph and
  /// replayed (launch gaps between the kernels of one call removed); same
  /// flush and events as median_ms.
  template <typename F>
  double graph_median_ms(F&& f, int reps) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    f(s);  // warm-up outside capture (one-time attribute setting)
    CK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    f(s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      do_flush(i, s);
      CK(cudaEventRecord(a, s));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  template <typename F>
  double median_ms(F&& f, int reps) {
    f();  // warm-up
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      do_flush(i, nullptr);
      CK(cudaEventRecord(a));
      f();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

// Fills n bytes of device memory by repeating a host template (one upload,
// then device-to-device doubling).
void fill_repeat(uint8_t* dst, size_t n, const std::vector<uint8_t>& tmpl) {
  const size_t first = std::min(tmpl.size(), n);
  CK(cudaMemcpy(dst, tmpl.data(), first, cudaMemcpyHostToDevice));
  for (size_t have = first; have < n;) {
    const size_t c = std::min(have, n - have);
    CK(cudaMemcpy(dst + have, dst, c, cudaMemcpyDeviceToDevice));
    have += c;
  }
}

std::vector<float> rotations_identityish(const LayerLayout& L, std::mt19937& rng) {
  // Speed does not depend on the rotation's values; a signed permutation is
  // orthogonal and cheap to build.
  std::vector<float> r;
  for (int h = 0; h < L.n_kv_heads(); ++h)
    for (int s = 0; s < 2; ++s)
      for (const auto& g : (s == 0 ? L.spec(h).key : L.spec(h).value)) {
        const int m = (int)g.channels.size();
        std::vector<int> p(m);
        for (int i = 0; i < m; ++i) p[i] = i;
        std::shuffle(p.begin(), p.end(), rng);
        for (int j = 0; j < m; ++j)
          for (int i = 0; i < m; ++i) r.push_back(i == p[j] ? ((j & 1) ? -1.f : 1.f) : 0.f);
      }
  return r;
}

/// Dense orthogonal rotations (two random Householder reflections, H1·H2),
/// for the prefill's timing: its GEMM should not run on a mostly-zero Π.
std::vector<float> rotations_dense(const LayerLayout& L, std::mt19937& rng) {
  std::normal_distribution<double> N;
  std::vector<float> r;
  for (int h = 0; h < L.n_kv_heads(); ++h)
    for (int s = 0; s < 2; ++s)
      for (const auto& g : (s == 0 ? L.spec(h).key : L.spec(h).value)) {
        const int m = (int)g.channels.size();
        std::vector<double> a(m), b(m);
        double na = 0, nb = 0;
        for (int i = 0; i < m; ++i) {
          a[i] = N(rng), b[i] = N(rng);
          na += a[i] * a[i], nb += b[i] * b[i];
        }
        // (I − 2aaᵀ/na)(I − 2bbᵀ/nb) = I − 2aaᵀ/na − 2bbᵀ/nb + 4(a·b) abᵀ/(na nb)
        double ab = 0;
        for (int i = 0; i < m; ++i) ab += a[i] * b[i];
        for (int j = 0; j < m; ++j)
          for (int i = 0; i < m; ++i)
            r.push_back((float)((i == j ? 1.0 : 0.0) - 2 * a[j] * a[i] / na - 2 * b[j] * b[i] / nb +
                                4 * ab * a[j] * b[i] / (na * nb)));
      }
  return r;
}

std::vector<float> levels_for(const LayerLayout& L) {
  std::vector<float> l;
  for (int h = 0; h < L.n_kv_heads(); ++h)
    for (int s = 0; s < 2; ++s)
      for (const auto& g : (s == 0 ? L.spec(h).key : L.spec(h).value)) {
        const int n = 1 << g.bits;
        for (int i = 0; i < n; ++i)
          l.push_back((2.f * i + 1.f - n) / n * 2.5f / std::sqrt((float)g.channels.size()));
      }
  return l;
}

LayerLayout block_gtq_k3v3(int n_kv_heads) {
  // Keys: 32 channels at 4 bits, 64 at 3, 32 at 2 (3.0 bits average, 3 norms);
  // values: uniform 3 bits.
  std::vector<HeadSpec> heads(n_kv_heads);
  for (auto& h : heads) {
    GroupSpec g4{{}, 4}, g3{{}, 3}, g2{{}, 2}, v{{}, 3};
    for (int c = 0; c < kD; ++c) {
      (c < 32 ? g4 : c < 96 ? g3 : g2).channels.push_back(c);
      v.channels.push_back(c);
    }
    h.key = {g4, g3, g2};
    h.value = {v};
  }
  return LayerLayout(kD, heads);
}

/// The packed layouts of the decode grid (head_dim kD, n_kv_heads KV heads),
/// by the name --only-cache takes: uniform K4V4, K3V3, K2V2 and Block-GTQ at
/// K3V3's bits.
struct PackedLayout {
  std::string name;
  LayerLayout L;
};
std::vector<PackedLayout> packed_layouts(int n_kv_heads) {
  return {{"K4V4", LayerLayout::uniform(kD, n_kv_heads, 4, 4)},
          {"K3V3", LayerLayout::uniform(kD, n_kv_heads, 3, 3)},
          {"K2V2", LayerLayout::uniform(kD, n_kv_heads, 2, 2)},
          {"K3V3-blockgtq", block_gtq_k3v3(n_kv_heads)}};
}

/// A packed pool of n_pages pages filled with random codes and valid fp16 norms
/// (a 64-page template repeated).
uint8_t* make_packed_pool(const LayerLayout& L, size_t n_pages, std::mt19937& rng) {
  uint8_t* pool;
  CK(cudaMalloc(&pool, n_pages * L.page_bytes()));
  HostPagePool tmpl{&L, std::vector<uint8_t>(64 * L.page_bytes())};
  for (auto& x : tmpl.bytes) x = (uint8_t)rng();
  std::uniform_real_distribution<float> U(0.5f, 2.f);
  for (int p = 0; p < 64; ++p)
    for (int h = 0; h < L.n_kv_heads(); ++h)
      for (Side s : {Side::key, Side::value})
        for (int g = 0; g < (int)L.head(h).side(s).size(); ++g)
          for (int t = 0; t < kPageTokens; ++t)
            write_norm(L, tmpl.page(p), h, s, g, t, fp32_to_fp16(U(rng)));
  fill_repeat(pool, n_pages * L.page_bytes(), tmpl.bytes);
  return pool;
}

/// A host pool of n_pages pages of L: random codes, fp16 norms in [0.5, 2).
std::vector<uint8_t> host_packed_pool(const LayerLayout& L, int n_pages, std::mt19937& rng) {
  HostPagePool pool{&L, std::vector<uint8_t>((size_t)n_pages * L.page_bytes())};
  for (auto& x : pool.bytes) x = (uint8_t)rng();
  std::uniform_real_distribution<float> U(0.5f, 2.f);
  for (int p = 0; p < n_pages; ++p)
    for (int h = 0; h < L.n_kv_heads(); ++h)
      for (Side s : {Side::key, Side::value})
        for (int g = 0; g < (int)L.head(h).side(s).size(); ++g)
          for (int t = 0; t < kPageTokens; ++t) write_norm(L, pool.page(p), h, s, g, t, fp32_to_fp16(U(rng)));
  return pool.bytes;
}

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d;
  CK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)));
  CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> v(n);
  CK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

/// Largest relative L2 error over the sequences of (batch, n_heads, head_dim) outputs.
double max_rel_err(const std::vector<float>& a, const std::vector<float>& ref, int batch) {
  const size_t n = a.size() / batch;
  double worst = 0;
  for (int b = 0; b < batch; ++b) {
    double e = 0, r = 0;
    for (size_t i = b * n; i < (b + 1) * n; ++i) {
      if (!std::isfinite(a[i])) return INFINITY;
      e += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
      r += (double)ref[i] * ref[i];
    }
    worst = std::max(worst, std::sqrt(e / r));
  }
  return worst;
}

/// The kernels timed below against their named CPU references, on a batch
/// of lengths 4096, 1, 97 (shuffled pages) of each model shape: the fp16
/// kernel, every packed layout in both variants (the reference with the
/// variant's rounding), and quantize-append at positions 4096, 1, 97. Rows
/// into J["reference_check"]; false when a kernel is off.
bool check_references(nlohmann::json& J) {
  std::mt19937 rng(5);
  const std::vector<int32_t> lens = {4096, 1, 97};
  const int B = (int)lens.size(), max_pages = 4096 / kPageTokens + 1, n_pages = B * max_pages;
  std::vector<int32_t> pt(n_pages);
  for (int i = 0; i < n_pages; ++i) pt[i] = i;
  std::shuffle(pt.begin(), pt.end(), rng);
  const ref::DecodeBatch rb{pt, max_pages, lens};
  int32_t* dpt = to_device(pt);
  int32_t* dlen = to_device(lens);
  const cuda::DecodeBatch db{dpt, max_pages, dlen, B, 4096};
  bool ok = true;
  nlohmann::json rows = nlohmann::json::array();
  std::normal_distribution<float> N;
  std::printf("reference check (B=%d, lengths 4096, 1, 97; rel err vs the named CPU reference):\n", B);
  for (const Shape& S : {kLlama, kQwen}) {
    std::vector<float> q((size_t)B * S.n_heads * kD);
    for (auto& x : q) x = N(rng);
    float* dq = to_device(q);
    float* dout;
    CK(cudaMalloc(&dout, q.size() * 4));
    const float scale = 1.f / std::sqrt((float)kD);
    auto row = [&](const std::string& cache, const std::string& what, double err, double limit) {
      const bool pass = err <= limit;
      ok = ok && pass;
      rows.push_back({{"model", S.model}, {"cache", cache}, {"check", what}, {"value", err}, {"limit", limit},
                      {"pass", pass}});
      std::printf("  %-12s %-14s %-34s %.2e %s\n", S.model, cache.c_str(), what.c_str(), err, pass ? "" : "FAIL");
    };
    {  // fp16 kernel
      const size_t page_elems = (size_t)S.n_kv_heads * 2 * kPageTokens * kD;
      std::vector<uint16_t> pool((size_t)n_pages * page_elems);
      for (auto& x : pool) x = fp32_to_fp16(N(rng));
      uint16_t* dpool = to_device(pool);
      const int splits = cuda::default_splits(B, S.n_kv_heads, 4096);
      const size_t ws_bytes = cuda::decode_workspace_bytes(B, S.n_heads, kD, splits);
      void* ws;
      CK(cudaMalloc(&ws, ws_bytes));
      const auto want = ref::fp16_decode_attention(S.n_heads, S.n_kv_heads, kD, rb, pool, q, scale);
      using V = cuda::Fp16DecodeVariant;
      for (const auto& [var, what] : {std::pair{V::automatic, "decode"}, std::pair{V::n8, "decode n8 (merge kernel)"},
                                      std::pair{V::n8_fused, "decode n8_fused"}}) {
        CK(cudaMemset(dout, 0xff, q.size() * 4));
        cuda::fp16_decode_attention(S.n_heads, S.n_kv_heads, kD, db, dpool, dq, cuda::DType::f32, scale, dout, ws,
                                    ws_bytes, splits, nullptr, var);
        CK(cudaDeviceSynchronize());
        row("fp16", what, max_rel_err(to_host(dout, q.size()), want, B), 1e-3);
      }
      CK(cudaFree(dpool));
      CK(cudaFree(ws));
    }
    for (const auto& [name, L] : packed_layouts(S.n_kv_heads)) {
      const auto rot = rotations_identityish(L, rng);
      const auto lvl = levels_for(L);
      const cuda::PackedPlan plan(L, S.n_heads, rot, lvl);
      const ref::PackedPlan rplan(L, S.n_heads, rot, lvl);
      std::vector<uint8_t> pool = host_packed_pool(L, n_pages, rng);
      uint8_t* dpool = to_device(pool);
      const int splits = cuda::default_splits(plan, B, 4096);
      const size_t ws_bytes = cuda::decode_workspace_bytes(B, S.n_heads, kD, splits);
      void* ws;
      CK(cudaMalloc(&ws, ws_bytes));
      const auto want16 = ref::packed_decode_attention(rplan, rb, pool, {}, q, scale, ref::PackedRounding::fp16);
      for (const auto variant : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables}) {
        cuda::packed_decode_attention(plan, db, dpool, dq, cuda::DType::f32, scale, dout, ws, ws_bytes, splits,
                                      nullptr, variant);
        CK(cudaDeviceSynchronize());
        const bool i8 = cuda::uses_int8_levels(plan, variant);
        const auto want =
            i8 ? ref::packed_decode_attention(rplan, rb, pool, {}, q, scale, ref::PackedRounding::int8_levels) : want16;
        row(name,
            std::string("decode ") + (variant == cuda::PackedDecodeVariant::specialized ? "specialized" : "runtime_tables") +
                (i8 ? " (int8 levels)" : " (fp16)"),
            max_rel_err(to_host(dout, q.size()), want, B), 1e-3);
      }
      // Quantize-append at positions 4096, 1, 97 (room for one more token in max_pages).
      std::vector<float> kv((size_t)B * S.n_kv_heads * kD);
      for (auto& x : kv) x = N(rng);
      float* dkv = to_device(kv);
      cuda::packed_append(plan, db, dpool, dkv, dkv, cuda::DType::f32, nullptr);
      CK(cudaDeviceSynchronize());
      const auto got = to_host(dpool, pool.size());
      ref::packed_append(rplan, rb, pool, kv, kv);
      // Codes that differ (bit placement is fixed: any difference is a code's).
      int diff = 0, codes = 0;
      for (int b = 0; b < B; ++b) {
        const int page = pt[(size_t)b * max_pages + lens[b] / kPageTokens], slot = lens[b] % kPageTokens;
        for (int h = 0; h < L.n_kv_heads(); ++h)
          for (Side s : {Side::key, Side::value})
            for (int g = 0; g < (int)L.head(h).side(s).size(); ++g) {
              const int m = L.head(h).side(s)[g].dim;
              std::vector<uint8_t> a(m), c(m);
              read_codes(L, std::span<const uint8_t>(got).subspan((size_t)page * L.page_bytes(), L.page_bytes()), h, s,
                         g, slot, a);
              read_codes(L, std::span<const uint8_t>(pool).subspan((size_t)page * L.page_bytes(), L.page_bytes()), h,
                         s, g, slot, c);
              for (int j = 0; j < m; ++j) diff += a[j] != c[j];
              codes += m;
            }
      }
      row(name, "append: codes unlike the reference", diff, 2 + codes / 100000);
      CK(cudaFree(dkv));
      CK(cudaFree(dpool));
      CK(cudaFree(ws));
    }
    CK(cudaFree(dq));
    CK(cudaFree(dout));
  }
  CK(cudaFree(dpt));
  CK(cudaFree(dlen));
  J["reference_check"] = rows;
  return ok;
}

struct Args {
  std::string out = "cuda_decode_bench.json";
  int reps = 30, only_b = 0;
  std::vector<int> only_t;  // --only-T T[,T...]: these context lengths only (empty: all)
  bool has_t(int T) const { return only_t.empty() || std::find(only_t.begin(), only_t.end(), T) != only_t.end(); }
  bool check = true;  // --no-check: skip check_references (ncu profiling runs)
  bool fp16_only = false;  // --fp16-only: the fp16 rows only (no packed layouts)
  bool read_flush = false;  // --flush read: flush L2 by reading (Timer)
  std::string only_model, only_cache;  // only_cache: one packed layout, no fp16 row (profiling)
  bool demo = false, prefill = true, sweep = false;
};

/// Memory demonstration: a 32-layer Llama-3.1-8B-shaped K3V3 cache at B=4,
/// T=512K (fp16 would be ~275 GB, beyond the card), one decode step over all
/// layers (attention per layer, then quantize-append per layer).
void run_demo(const Args& A, Timer& timer, nlohmann::json& J) {
  constexpr int kLayers = 32, B = 4, T = 512 * 1024;
  const Shape S = kLlama;
  const LayerLayout L = LayerLayout::uniform(kD, S.n_kv_heads, 3, 3);
  std::mt19937 rng(7);
  const int pages_per_seq = T / kPageTokens;
  const size_t n_pages = (size_t)B * pages_per_seq;
  size_t free0, total;
  CK(cudaMemGetInfo(&free0, &total));
  std::vector<std::unique_ptr<cuda::PackedPlan>> plans;
  std::vector<uint8_t*> pools;
  uint8_t* first = nullptr;
  for (int l = 0; l < kLayers; ++l) {
    auto rot = rotations_identityish(L, rng);
    auto lvl = levels_for(L);
    plans.push_back(std::make_unique<cuda::PackedPlan>(L, S.n_heads, rot, lvl));
    if (l == 0) {
      first = make_packed_pool(L, n_pages, rng);
      pools.push_back(first);
    } else {
      uint8_t* p;
      CK(cudaMalloc(&p, n_pages * L.page_bytes()));
      CK(cudaMemcpy(p, first, n_pages * L.page_bytes(), cudaMemcpyDeviceToDevice));
      pools.push_back(p);
    }
  }
  size_t free1;
  CK(cudaMemGetInfo(&free1, &total));
  std::vector<int32_t> pt(n_pages);
  for (size_t i = 0; i < n_pages; ++i) pt[i] = (int32_t)i;
  std::shuffle(pt.begin(), pt.end(), rng);
  std::vector<int32_t> lens(B, T), pos(B, T - 1);  // attend T tokens; append rewrites slot T−1
  int32_t *dpt, *dlen;
  CK(cudaMalloc(&dpt, pt.size() * 4));
  CK(cudaMalloc(&dlen, B * 4));
  CK(cudaMemcpy(dpt, pt.data(), pt.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dlen, lens.data(), B * 4, cudaMemcpyHostToDevice));
  cuda::DecodeBatch db{dpt, pages_per_seq, dlen, B, T};
  std::vector<float> q((size_t)B * S.n_heads * kD), kv((size_t)B * S.n_kv_heads * kD);
  std::normal_distribution<float> N;
  for (auto& x : q) x = N(rng);
  for (auto& x : kv) x = N(rng);
  float *dq, *dout, *dkv;
  CK(cudaMalloc(&dq, q.size() * 4));
  CK(cudaMalloc(&dout, q.size() * 4 * kLayers));
  CK(cudaMalloc(&dkv, kv.size() * 4));
  CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dkv, kv.data(), kv.size() * 4, cudaMemcpyHostToDevice));
  const int splits = cuda::default_splits(*plans[0], B, T);
  const size_t ws_bytes = cuda::decode_workspace_bytes(B, S.n_heads, kD, splits);
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  const float scale = 1.f / std::sqrt((float)kD);
  // Attention is the step's cache read; the append (T−1 → T) writes one slot.
  const double attn_ms = timer.median_ms(
      [&] {
        for (int l = 0; l < kLayers; ++l)
          cuda::packed_decode_attention(*plans[l], db, pools[l], dq, cuda::DType::f32, scale,
                                        dout + (size_t)l * q.size(), ws, ws_bytes, splits, nullptr);
      },
      std::max(5, A.reps / 3));
  CK(cudaMemcpy(dlen, pos.data(), B * 4, cudaMemcpyHostToDevice));
  const double append_ms = timer.median_ms(
      [&] {
        for (int l = 0; l < kLayers; ++l)
          cuda::packed_append(*plans[l], db, pools[l], dkv, dkv, cuda::DType::f32, nullptr);
      },
      std::max(5, A.reps / 3));
  std::vector<float> out((size_t)kLayers * q.size());
  CK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
  size_t finite = 0;
  for (float x : out) finite += std::isfinite(x) ? 1 : 0;
  const double packed_bytes = (double)kLayers * n_pages * L.page_bytes();
  const double fp16_bytes = (double)kLayers * B * T * S.n_kv_heads * 2 * kD * 2;
  J["memory_demo"] = {
      {"model", S.model}, {"layers", kLayers}, {"B", B}, {"T", T}, {"cache", "K3V3"},
      {"packed_cache_bytes", packed_bytes}, {"fp16_cache_bytes", fp16_bytes},
      {"device_memory_bytes", total}, {"allocated_bytes", (double)(free0 - free1)},
      {"step_attention_ms", attn_ms}, {"step_append_ms", append_ms},
      {"attention_GBps", packed_bytes / (attn_ms * 1e-3) / 1e9},
      {"outputs_finite", finite == out.size()}, {"splits", splits}};
  std::printf("memory demo: %d layers, B=%d, T=%d, K3V3 cache %.1f GB (fp16 would be %.1f GB; card %.1f GB)\n"
              "  one decode step, attention over all layers: %.3f ms (%.0f GB/s); quantize-append all layers: %.3f ms; outputs finite: %s\n",
              kLayers, B, T, packed_bytes / 1e9, fp16_bytes / 1e9, total / 1e9, attn_ms,
              packed_bytes / (attn_ms * 1e-3) / 1e9, append_ms, finite == out.size() ? "yes" : "NO");
  for (auto* p : pools) CK(cudaFree(p));
  CK(cudaFree(dpt));
  CK(cudaFree(dlen));
  CK(cudaFree(dq));
  CK(cudaFree(dout));
  CK(cudaFree(dkv));
  CK(cudaFree(ws));
}

/// Prefill-quantize throughput: one call writes a T-token prompt of every
/// sequence (all KV heads, one layer) from fp16 K/V, in both variants
/// (fp32: the rotation on the CUDA cores, the v9 kernel; tensor_cores: the
/// cuBLAS GEMM + quantize kernel). GB/s: fp16 K/V read + packed bytes
/// written; TFLOP/s: the rotation's useful FLOPs (2·m² per token, KV head,
/// side and group of m channels) over the whole call's time.
void run_prefill(const Args& A, Timer& timer, nlohmann::json& rows) {
  std::mt19937 rng(11);
  for (const Shape& S : {kLlama, kQwen}) {
    if (!A.only_model.empty() && A.only_model != S.model) continue;
    for (int T : {4096, 32768, 131072}) {
      if (!A.has_t(T)) continue;
      const int B = 1;
      struct Lay {
        std::string name;
        LayerLayout L;
      };
      for (const Lay& lay : {Lay{"K3V3", LayerLayout::uniform(kD, S.n_kv_heads, 3, 3)},
                             Lay{"K3V3-blockgtq", block_gtq_k3v3(S.n_kv_heads)}}) {
        if (!A.only_cache.empty() && lay.name != A.only_cache) continue;
        const int pages = (T + kPageTokens - 1) / kPageTokens;
        auto rot = rotations_dense(lay.L, rng);
        auto lvl = levels_for(lay.L);
        cuda::PackedPlan plan(lay.L, S.n_heads, rot, lvl);
        double flop_per_token = 0;
        for (int h = 0; h < lay.L.n_kv_heads(); ++h)
          for (Side sd : {Side::key, Side::value})
            for (const auto& G : lay.L.head(h).side(sd)) flop_per_token += 2.0 * G.dim * G.dim;
        uint8_t* pool;
        CK(cudaMalloc(&pool, (size_t)pages * lay.L.page_bytes()));
        std::vector<int32_t> pt(pages), lens(B, 0);
        for (int i = 0; i < pages; ++i) pt[i] = i;
        std::shuffle(pt.begin(), pt.end(), rng);
        int32_t *dpt, *dlen;
        CK(cudaMalloc(&dpt, pt.size() * 4));
        CK(cudaMalloc(&dlen, 4));
        CK(cudaMemcpy(dpt, pt.data(), pt.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dlen, lens.data(), 4, cudaMemcpyHostToDevice));
        const size_t n = (size_t)B * T * S.n_kv_heads * kD;
        std::vector<uint16_t> x(std::min<size_t>(n, 1 << 22));
        std::normal_distribution<float> N;
        for (auto& e : x) e = fp32_to_fp16(N(rng));
        uint8_t *dk, *dv;
        CK(cudaMalloc(&dk, n * 2));
        CK(cudaMalloc(&dv, n * 2));
        std::vector<uint8_t> xb(x.size() * 2);
        std::memcpy(xb.data(), x.data(), xb.size());
        fill_repeat(dk, n * 2, xb);
        fill_repeat(dv, n * 2, xb);
        cuda::DecodeBatch db{dpt, pages, dlen, B, T};
        const double bytes = 2.0 * n * 2 + (double)B * T * lay.L.page_bytes() / kPageTokens;
        const double flops = flop_per_token * B * T;
        auto r = nlohmann::json{{"model", S.model}, {"cache", lay.name}, {"B", B}, {"T", T},
                                {"bytes", bytes}, {"rotation_flop", flops}};
        for (const auto var : {cuda::PrefillVariant::fp32, cuda::PrefillVariant::tensor_cores}) {
          const std::string vn = var == cuda::PrefillVariant::fp32 ? "fp32" : "tensor_cores";
          const double ms = timer.median_ms(
              [&] { cuda::packed_prefill(plan, db, pool, dk, dv, T, cuda::DType::f16, nullptr, var); },
              std::max(5, A.reps / 3));
          r[vn] = {{"ms", ms}, {"tokens_per_s", B * T / (ms * 1e-3)}, {"GBps", bytes / (ms * 1e-3) / 1e9},
                   {"TFLOPs", flops / (ms * 1e-3) / 1e12}};
          std::printf("prefill %-12s %-14s %-12s B=%d T=%7d: %8.3f ms  %.2f Mtok/s  %.0f GB/s  %.1f TFLOP/s (one layer, all heads)\n",
                      S.model, lay.name.c_str(), vn.c_str(), B, T, ms, B * T / (ms * 1e-3) / 1e6,
                      bytes / (ms * 1e-3) / 1e9, flops / (ms * 1e-3) / 1e12);
        }
        // Legacy fields (older summaries): the default variant.
        r["ms"] = r["tensor_cores"]["ms"];
        r["tokens_per_s"] = r["tensor_cores"]["tokens_per_s"];
        r["speedup_vs_fp32"] = r["fp32"]["ms"].get<double>() / r["tensor_cores"]["ms"].get<double>();
        rows.push_back(r);
        CK(cudaFree(pool));
        CK(cudaFree(dpt));
        CK(cudaFree(dlen));
        CK(cudaFree(dk));
        CK(cudaFree(dv));
      }
    }
  }
}

/// The value of integer flag `flag`: a whole positive number, else a usage error (exit 2).
int positive_int(const char* flag, const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < 1 || v > INT32_MAX) {
    std::fprintf(stderr, "bench_cuda_decode: %s '%s': expected a positive integer\n", flag, s.c_str());
    std::exit(2);
  }
  return (int)v;
}

}  // namespace

int main(int argc, char** argv) {
  Args A;
  for (int i = 1; i < argc; ++i) {
    const bool more = i + 1 < argc;
    if (!std::strcmp(argv[i], "--out") && more) A.out = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && more) A.reps = positive_int("--reps", argv[++i]);
    else if (!std::strcmp(argv[i], "--only-B") && more) A.only_b = positive_int("--only-B", argv[++i]);
    else if (!std::strcmp(argv[i], "--only-T") && more) {
      const std::string list = argv[++i];
      for (size_t at = 0;;) {  // comma list; an empty item is refused by positive_int
        const size_t c = list.find(',', at);
        A.only_t.push_back(positive_int("--only-T", list.substr(at, c == std::string::npos ? c : c - at)));
        if (c == std::string::npos) break;
        at = c + 1;
      }
    }
    else if (!std::strcmp(argv[i], "--only-model") && more) A.only_model = argv[++i];
    else if (!std::strcmp(argv[i], "--only-cache") && more) A.only_cache = argv[++i];
    else if (!std::strcmp(argv[i], "--demo")) A.demo = true;
    else if (!std::strcmp(argv[i], "--no-prefill")) A.prefill = false;
    else if (!std::strcmp(argv[i], "--sweep-splits")) A.sweep = true;
    else if (!std::strcmp(argv[i], "--no-check")) A.check = false;
    else if (!std::strcmp(argv[i], "--fp16-only")) A.fp16_only = true;
    else if (!std::strcmp(argv[i], "--flush") && more && (!std::strcmp(argv[i + 1], "read") ||
                                                          !std::strcmp(argv[i + 1], "write")))
      A.read_flush = !std::strcmp(argv[++i], "read");
    else {
      std::fprintf(stderr,
                   "usage: bench_cuda_decode [--out FILE] [--reps N] [--only-B B] [--only-T T[,T...]] "
                   "[--only-model llama-3.1-8b|qwen2.5-3b] [--only-cache K3V3|...] [--no-prefill] [--sweep-splits] [--no-check] [--fp16-only] [--demo] [--flush write|read]\n"
                   "  --flush: how L2 is flushed before each timed run: write (default) a 512 MB memset, read a\n"
                   "  read-only pass over 512 MB (L2 left clean, as after the weight GEMMs of a decode step)\n"
                   "  --no-check: skip the reference check (profiling runs under ncu only: their first launch\n"
                   "  of a kernel is the timed point's; timings are not results then)\n");
      return 2;
    }
  }
  // A filter that matches nothing would print an empty table: refuse it (the
  // layouts of the decode grid; run_prefill times two of them).
  const std::vector<PackedLayout> grid_layouts = packed_layouts(1);
  if (!A.only_cache.empty() && std::none_of(grid_layouts.begin(), grid_layouts.end(),
                                            [&](const PackedLayout& l) { return A.only_cache == l.name; })) {
    std::fprintf(stderr, "bench_cuda_decode: --only-cache '%s': expected one packed layout, K4V4, K3V3, K2V2 or "
                 "K3V3-blockgtq (the fp16 rows: --fp16-only)\n", A.only_cache.c_str());
    return 2;
  }
  if (!A.only_model.empty() && A.only_model != kLlama.model && A.only_model != kQwen.model) {
    std::fprintf(stderr, "bench_cuda_decode: --only-model '%s': expected %s or %s\n", A.only_model.c_str(),
                 kLlama.model, kQwen.model);
    return 2;
  }
  if (!A.only_cache.empty() && A.fp16_only) {
    std::fprintf(stderr, "bench_cuda_decode: --only-cache and --fp16-only select disjoint rows: give one\n");
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  Timer timer;
  timer.write_flush = !A.read_flush;
  nlohmann::json J;
  J["device"] = prop.name;
  J["sms"] = prop.multiProcessorCount;
  J["l2_bytes"] = prop.l2CacheSize;
  J["head_dim"] = kD;
  J["reference_check"] = A.check;
  if (A.check && !check_references(J)) {
    std::ofstream(A.out) << J.dump(2) << "\n";
    std::fprintf(stderr, "a kernel disagrees with its named CPU reference: no timings\n");
    return 1;
  }
  J["timing"] = "CUDA events around one call (one layer; the demo: one step over all layers), median of " +
                std::to_string(A.reps) + (A.read_flush ? ", 512 MB read (read_probe) before each run to flush L2 (clean lines)"
                                          : ", 512 MB memset before each run to flush L2") + "; ms_graph: the same call "
                "captured once in a CUDA graph and replayed";
  if (A.demo) {
    run_demo(A, timer, J);
    std::ofstream(A.out) << J.dump(2) << "\n";
    return 0;
  }

  // Copy ceiling: 4 GiB D2D copy, bytes read + written.
  {
    const size_t n = 2ull << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, n));
    CK(cudaMalloc(&dst, n));
    CK(cudaMemset(src, 1, n));
    const double ms = timer.median_ms([&] { CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice)); }, 10);
    J["copy_ceiling_GBps"] = 2.0 * n / (ms * 1e-3) / 1e9;
    std::printf("copy ceiling: %.0f GB/s\n", J["copy_ceiling_GBps"].get<double>());
    CK(cudaFree(src));
    CK(cudaFree(dst));
  }
  const double ceiling = J["copy_ceiling_GBps"].get<double>();
  // Read ceiling: 4 GiB read once with 16-byte loads (cuda::read_probe).
  uint32_t* sink;
  CK(cudaMalloc(&sink, cuda::kReadProbeBlocks * sizeof(uint32_t)));
  {
    const size_t n = 4ull << 30;
    void* buf;
    CK(cudaMalloc(&buf, n));
    CK(cudaMemset(buf, 0x5a, n));
    const double ms = timer.median_ms([&] { cuda::read_probe(buf, n, sink, nullptr); }, 10);
    J["read_ceiling_GBps"] = n / (ms * 1e-3) / 1e9;
    std::printf("read ceiling: %.0f GB/s (read-only, 4 GiB)\n", J["read_ceiling_GBps"].get<double>());
    CK(cudaFree(buf));
  }
  const double read_ceiling = J["read_ceiling_GBps"].get<double>();

  struct Case {
    Shape S;
    int B, T;
  };
  std::vector<Case> cases;
  // The grid of issue 19: both shapes, B ∈ {1, 8, 32}, T ∈ {4K, 32K, 128K};
  // 512K where the fp16 cache fits the card (≤ 70 GB).
  for (const Shape& S : {kLlama, kQwen})
    for (int B : {1, 8, 32})
      for (int T : {4096, 32768, 131072}) cases.push_back({S, B, T});
  cases.push_back({kLlama, 1, 524288});
  cases.push_back({kLlama, 8, 524288});
  cases.push_back({kQwen, 1, 524288});
  cases.push_back({kQwen, 8, 524288});
  cases.push_back({kQwen, 32, 524288});
  // A serving point past one wave of the fp16 kernel (the engine's step
  // profile at depth 512, B = 109: attention ~4x off its bytes).
  cases.push_back({kLlama, 109, 512});

  std::mt19937 rng(1);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-12s %-14s %2s %7s %10s %10s %10s %8s %8s\n", "model", "cache", "B", "T", "ms",
              "ms(graph)", "GB/s", "%ceil", "vs fp16");
  for (const Case& C : cases) {
    const Shape S = C.S;
    const int B = C.B, T = C.T;
    if ((A.only_b && B != A.only_b) || !A.has_t(T) ||
        (!A.only_model.empty() && A.only_model != S.model))
      continue;
    const bool short_t = T <= 32768;  // graph replay where launch gaps can matter
    const int pages_per_seq = (T + kPageTokens - 1) / kPageTokens;
    const int n_pages = B * pages_per_seq;
    std::vector<int32_t> pt(n_pages);
    for (int i = 0; i < n_pages; ++i) pt[i] = i;
    std::shuffle(pt.begin(), pt.end(), rng);  // scattered pages, as a paged allocator gives
    std::vector<int32_t> lens(B, T);
    int32_t *dpt, *dlen;
    CK(cudaMalloc(&dpt, pt.size() * 4));
    CK(cudaMalloc(&dlen, lens.size() * 4));
    CK(cudaMemcpy(dpt, pt.data(), pt.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlen, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
    cuda::DecodeBatch db{dpt, pages_per_seq, dlen, B, T};
    std::vector<float> q((size_t)B * S.n_heads * kD);
    std::normal_distribution<float> N;
    for (auto& x : q) x = N(rng);
    float *dq, *dout;
    CK(cudaMalloc(&dq, q.size() * 4));
    CK(cudaMalloc(&dout, q.size() * 4));
    CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    const double scale = 1.0 / std::sqrt((double)kD);
    auto base_row = [&](const std::string& cache) {
      return nlohmann::json{{"model", S.model}, {"n_heads", S.n_heads}, {"n_kv_heads", S.n_kv_heads},
                            {"cache", cache}, {"B", B}, {"T", T}};
    };

    // fp16 cache, same kernel structure.
    double fp16_ms = -1;
    if (A.only_cache.empty()) {
      const size_t page_bytes = (size_t)S.n_kv_heads * 2 * kPageTokens * kD * 2;
      uint8_t* pool;
      CK(cudaMalloc(&pool, n_pages * page_bytes));
      std::vector<uint8_t> tmpl(16 << 20);
      for (size_t i = 0; i < tmpl.size(); i += 2) {
        const uint16_t h = fp32_to_fp16(N(rng));
        std::memcpy(&tmpl[i], &h, 2);
      }
      fill_repeat(pool, n_pages * page_bytes, tmpl);
      // Variants and split counts: the default (what n_splits = 0 and
      // variant automatic give), rows16, and n8 at ¼, ½, 2x, 4x its default
      // splits (at most one split per 16-token tile).
      struct Fp16Try {
        std::string name;
        cuda::Fp16DecodeVariant var;
        int splits;
      };
      const auto n8v = cuda::Fp16DecodeVariant::n8, r16 = cuda::Fp16DecodeVariant::rows16;
      const int d_auto = cuda::fp16_default_splits(B, S.n_kv_heads, S.n_heads, kD, T);
      const int d_n8 = cuda::fp16_default_splits(B, S.n_kv_heads, S.n_heads, kD, T, n8v);
      const int d_r16 = cuda::fp16_default_splits(B, S.n_kv_heads, S.n_heads, kD, T, r16);
      std::vector<Fp16Try> tries = {{"default", cuda::Fp16DecodeVariant::automatic, d_auto},
                                    {"rows16", r16, d_r16}};
      // The n8 kernel with the separate merge kernel and with the in-kernel
      // merge at its default splits (automatic picks one of them by
      // cuda::fp16_fused_merge).
      tries.push_back({"n8", n8v, d_n8});
      tries.push_back({"n8_fused", cuda::Fp16DecodeVariant::n8_fused, d_n8});
      for (int sp : {d_n8 / 4, d_n8 / 2, d_n8 * 2, d_n8 * 4})
        if (sp >= 1 && sp <= (T + 15) / 16) tries.push_back({"n8", n8v, sp});
      int max_sp = 0;
      for (const auto& t : tries) max_sp = std::max(max_sp, t.splits);
      const size_t fws_bytes = cuda::decode_workspace_bytes(B, S.n_heads, kD, max_sp);
      void* fws;
      CK(cudaMalloc(&fws, fws_bytes));
      nlohmann::json fvars = nlohmann::json::array();
      double graph_ms = -1, best_ms = 1e30;
      std::string best_name;
      for (const auto& t : tries) {
        auto call = [&](cudaStream_t st) {
          cuda::fp16_decode_attention(S.n_heads, S.n_kv_heads, kD, db, reinterpret_cast<uint16_t*>(pool),
                                      dq, cuda::DType::f32, (float)scale, dout, fws, fws_bytes, t.splits, st,
                                      t.var);
        };
        const double m = timer.median_ms([&] { call(nullptr); }, A.reps);
        if (t.name == "default") {
          fp16_ms = m;
          graph_ms = short_t ? timer.graph_median_ms(call, A.reps) : -1;
        }
        if (m < best_ms) {
          best_ms = m;
          best_name = t.name + "/" + std::to_string(t.splits);
        }
        fvars.push_back({{"variant", t.name}, {"splits", t.splits}, {"ms", m}});
      }
      CK(cudaFree(fws));
      const double bytes = (double)B * T * S.n_kv_heads * 2 * kD * 2;
      const double gbs = bytes / (fp16_ms * 1e-3) / 1e9;
      const double probe_ms = timer.median_ms([&] { cuda::read_probe(pool, bytes, sink, nullptr); }, A.reps);
      auto r = base_row("fp16");
      r.update({{"ms", fp16_ms}, {"ms_graph", graph_ms}, {"cache_bytes", bytes}, {"GBps", gbs},
                {"frac_ceiling", gbs / ceiling}, {"frac_read_ceiling", gbs / read_ceiling},
                {"read_probe_ms", probe_ms}, {"splits", d_auto},
                {"fused_merge", cuda::fp16_fused_merge(S.n_heads / S.n_kv_heads, d_auto,
                                                       cuda::Fp16DecodeVariant::automatic)},
                {"fp16_variants", fvars},
                {"fp16_best_ms", best_ms}, {"fp16_best", best_name}});
      rows.push_back(r);
      std::printf("%-12s %-14s %2d %7d %10.4f %10.4f %10.0f %7.1f%% %8s  (read %.0f%%; best %s %.4f ms; probe %.4f ms)\n",
                  S.model, "fp16", B, T, fp16_ms, graph_ms, gbs, 100 * gbs / ceiling, "1.00x",
                  100 * gbs / read_ceiling, best_name.c_str(), best_ms, probe_ms);
      CK(cudaFree(pool));
    }
    for (const PackedLayout& lay : packed_layouts(S.n_kv_heads)) {
      if ((!A.only_cache.empty() && lay.name != A.only_cache) || A.fp16_only) continue;
      auto rot = rotations_identityish(lay.L, rng);
      auto lvl = levels_for(lay.L);
      cuda::PackedPlan plan(lay.L, S.n_heads, rot, lvl);
      uint8_t* pool = make_packed_pool(lay.L, n_pages, rng);
      const int psplits = cuda::default_splits(plan, B, T);
      const size_t pws_bytes = cuda::decode_workspace_bytes(B, S.n_heads, kD, psplits);
      void* pws;
      CK(cudaMalloc(&pws, pws_bytes));
      auto call = [&](cudaStream_t st, cuda::PackedDecodeVariant var) {
        cuda::packed_decode_attention(plan, db, pool, dq, cuda::DType::f32, (float)scale, dout, pws,
                                      pws_bytes, psplits, st, var);
      };
      const auto spec = cuda::PackedDecodeVariant::specialized;
      const double ms = timer.median_ms([&] { call(nullptr, spec); }, A.reps);
      const double graph_ms =
          short_t ? timer.graph_median_ms([&](cudaStream_t st) { call(st, spec); }, A.reps) : -1;
      // Split-count sweep (--sweep-splits; the default aims at one full wave of
      // ≥ 2-page splits; fewer pages per split shorten each warp's chain, fewer
      // splits shorten the merge). CUDA-graph times at short T only.
      nlohmann::json sweep = nlohmann::json::array();
      if (A.sweep) {
        const int pages = pages_per_seq;
        int prev = -1;  // small defaults round two fractions to the same count: measure it once
        for (int sp : {psplits / 4, psplits / 2, psplits * 3 / 4, psplits * 3 / 2, psplits * 2, psplits * 4}) {
          if (sp < 1 || sp > pages || sp == psplits || sp == prev) continue;
          prev = sp;
          const size_t need = cuda::decode_workspace_bytes(B, S.n_heads, kD, sp);
          void* ws2;
          CK(cudaMalloc(&ws2, need));
          auto call2 = [&](cudaStream_t st) {
            cuda::packed_decode_attention(plan, db, pool, dq, cuda::DType::f32, (float)scale, dout,
                                          ws2, need, sp, st, spec);
          };
          const double m1 = timer.median_ms([&] { call2(nullptr); }, A.reps);
          nlohmann::json m2;  // null: not measured (long T)
          if (short_t) m2 = timer.graph_median_ms(call2, A.reps);
          sweep.push_back({{"splits", sp}, {"ms", m1}, {"ms_graph", m2}});
          std::printf("  split sweep %s %-14s B=%d T=%d: %d splits %.4f ms (default %d: %.4f ms)\n", S.model,
                      lay.name.c_str(), B, T, sp, m1, psplits, ms);
          CK(cudaFree(ws2));
        }
      }
      // The fp16-level variant (runtime_tables) for a 3-bit and a 4-bit (16-level
      // decode) layout; -1 = not measured.
      double runtime_tables_ms = -1;
      if (lay.name == "K3V3" || lay.name == "K4V4")
        runtime_tables_ms = timer.median_ms(
            [&] { call(nullptr, cuda::PackedDecodeVariant::runtime_tables); }, A.reps);
      const double bytes = (double)B * T * lay.L.page_bytes() / kPageTokens;
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      // The same bytes read by the read-only probe (the pool: B·T/64 pages).
      const double probe_ms = timer.median_ms(
          [&] { cuda::read_probe(pool, (size_t)n_pages * lay.L.page_bytes(), sink, nullptr); }, A.reps);
      // quantize-append of one token per sequence (all heads, one layer)
      std::vector<float> kv((size_t)B * S.n_kv_heads * kD);
      for (auto& x : kv) x = N(rng);
      float* dkv;
      CK(cudaMalloc(&dkv, kv.size() * 4));
      CK(cudaMemcpy(dkv, kv.data(), kv.size() * 4, cudaMemcpyHostToDevice));
      std::vector<int32_t> pos(B, T - 1);
      int32_t* dpos;
      CK(cudaMalloc(&dpos, B * 4));
      CK(cudaMemcpy(dpos, pos.data(), B * 4, cudaMemcpyHostToDevice));
      cuda::DecodeBatch ab{dpt, pages_per_seq, dpos, B, T};
      const double append_ms = timer.median_ms(
          [&] { cuda::packed_append(plan, ab, pool, dkv, dkv, cuda::DType::f32, nullptr); }, A.reps);
      auto r = base_row(lay.name);
      r.update({{"ms", ms}, {"ms_graph", graph_ms}, {"cache_bytes", bytes},
                {"bytes_per_token_per_head", lay.L.bytes_per_token_per_head()}, {"GBps", gbs},
                {"frac_ceiling", gbs / ceiling}, {"frac_read_ceiling", gbs / read_ceiling},
                {"read_probe_ms", probe_ms}, {"frac_of_probe", probe_ms / ms},
                {"speedup_vs_fp16_kernel", fp16_ms > 0 ? nlohmann::json(fp16_ms / ms) : nlohmann::json()},
                {"append_ms", append_ms}, {"append_tokens_per_s", B / (append_ms * 1e-3)},
                {"runtime_tables_variant_ms", runtime_tables_ms}, {"splits", psplits},
                {"split_sweep", sweep}});
      rows.push_back(r);
      // vs fp16: n/a when the fp16 row was not run (--only-cache without fp16).
      char vs_fp16[32] = "     n/a";
      if (fp16_ms > 0) std::snprintf(vs_fp16, sizeof vs_fp16, "%7.2fx", fp16_ms / ms);
      std::printf("%-12s %-14s %2d %7d %10.4f %10.4f %10.0f %7.1f%% %s  (read %.0f%%, probe %.4f ms; append %.4f ms)\n",
                  S.model, lay.name.c_str(), B, T, ms, graph_ms, gbs, 100 * gbs / ceiling, vs_fp16,
                  100 * gbs / read_ceiling, probe_ms, append_ms);
      CK(cudaFree(dkv));
      CK(cudaFree(dpos));
      CK(cudaFree(pool));
      CK(cudaFree(pws));
    }
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    CK(cudaFree(dpt));
    CK(cudaFree(dlen));
  }
  CK(cudaFree(sink));
  J["rows"] = rows;
  if (A.prefill) {
    nlohmann::json prow = nlohmann::json::array();
    run_prefill(A, timer, prow);
    J["prefill"] = prow;
  }
  std::ofstream(A.out) << J.dump(2) << "\n";
  return 0;
}
