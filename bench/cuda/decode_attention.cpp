// Decode-attention benchmark on the GPU: packed-cache kernel (uniform K4V4,
// K3V3, K2V2 and a Block-GTQ-style mixed-width K3V3 layout) vs the fp16-cache
// kernel of the same structure, with the device-to-device copy ceiling
// measured in the same run. Llama-3.1-8B attention shapes (32 query / 8 KV
// heads, head_dim 128). Time per decode step (one layer): CUDA events around
// the attention call only, median of N runs, L2 flushed (a 512 MB memset)
// before each run. Writes JSON (--out FILE) and prints a table.
// The torch SDPA flash baseline runs in the same device call
// (tools/device/sdpa_baseline.py).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ratekv/cuda/decode_attention.h"
#include "ratekv/fp16.h"
#include "ratekv/packed_format.h"

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

constexpr int kHq = 32, kHkv = 8, kD = 128;

struct Timer {
  void* flush = nullptr;
  size_t flush_bytes = 512ull << 20;
  cudaEvent_t a, b;
  Timer() {
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  template <typename F>
  double median_ms(F&& f, int reps) {
    f();  // warm-up
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      CK(cudaMemsetAsync(flush, i & 0xff, flush_bytes));
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

// Fills n bytes of device memory by repeating a host template.
void fill_repeat(uint8_t* dst, size_t n, const std::vector<uint8_t>& tmpl) {
  for (size_t off = 0; off < n; off += tmpl.size())
    CK(cudaMemcpy(dst + off, tmpl.data(), std::min(tmpl.size(), n - off), cudaMemcpyHostToDevice));
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

LayerLayout block_gtq_k3v3() {
  // Keys: 32 channels at 4 bits, 64 at 3, 32 at 2 (3.0 bits average, 3 norms);
  // values: uniform 3 bits.
  std::vector<HeadSpec> heads(kHkv);
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

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "cuda_decode_bench.json";
  int reps = 30, only_b = 0, only_t = 0;  // --only-B / --only-T: one case (profiling)
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--out")) out_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--only-B")) only_b = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--only-T")) only_t = std::atoi(argv[i + 1]);
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  Timer timer;
  nlohmann::json J;
  J["device"] = prop.name;
  J["sms"] = prop.multiProcessorCount;
  J["l2_bytes"] = prop.l2CacheSize;
  J["shape"] = {{"n_heads", kHq}, {"n_kv_heads", kHkv}, {"head_dim", kD}};
  J["timing"] = "CUDA events around one decode-attention call (one layer), median of " +
                std::to_string(reps) + ", 512 MB memset before each run to flush L2";

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

  struct Layout {
    std::string name;
    LayerLayout L;
  };
  std::vector<Layout> layouts;
  layouts.push_back({"K4V4", LayerLayout::uniform(kD, kHkv, 4, 4)});
  layouts.push_back({"K3V3", LayerLayout::uniform(kD, kHkv, 3, 3)});
  layouts.push_back({"K2V2", LayerLayout::uniform(kD, kHkv, 2, 2)});
  layouts.push_back({"K3V3-blockgtq", block_gtq_k3v3()});

  std::mt19937 rng(1);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-14s %2s %7s %10s %10s %8s %8s\n", "cache", "B", "T", "ms", "GB/s", "%ceil",
              "vs fp16");
  for (int B : {1, 8}) {
    if (only_b && B != only_b) continue;
    for (int T : {4096, 32768, 131072}) {
      if (only_t && T != only_t) continue;
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
      std::vector<float> q((size_t)B * kHq * kD);
      std::normal_distribution<float> N;
      for (auto& x : q) x = N(rng);
      float *dq, *dout;
      CK(cudaMalloc(&dq, q.size() * 4));
      CK(cudaMalloc(&dout, q.size() * 4));
      CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
      const int splits = cuda::default_splits(B, kHkv, T);
      const size_t ws_bytes = cuda::decode_workspace_bytes(B, kHq, kD, splits);
      void* ws;
      CK(cudaMalloc(&ws, ws_bytes));
      const double scale = 1.0 / std::sqrt((double)kD);

      // fp16 cache, same kernel structure.
      double fp16_ms;
      {
        const size_t page_bytes = (size_t)kHkv * 2 * kPageTokens * kD * 2;
        uint8_t* pool;
        CK(cudaMalloc(&pool, n_pages * page_bytes));
        std::vector<uint8_t> tmpl(16 << 20);
        for (size_t i = 0; i < tmpl.size(); i += 2) {
          const uint16_t h = fp32_to_fp16(N(rng));
          std::memcpy(&tmpl[i], &h, 2);
        }
        fill_repeat(pool, n_pages * page_bytes, tmpl);
        fp16_ms = timer.median_ms(
            [&] {
              cuda::fp16_decode_attention(kHq, kHkv, kD, db, reinterpret_cast<uint16_t*>(pool), dq,
                                          cuda::DType::f32, (float)scale, dout, ws, ws_bytes,
                                          splits, nullptr);
            },
            reps);
        const double bytes = (double)B * T * kHkv * 2 * kD * 2;
        const double gbs = bytes / (fp16_ms * 1e-3) / 1e9;
        rows.push_back({{"cache", "fp16"}, {"B", B}, {"T", T}, {"ms", fp16_ms},
                        {"cache_bytes", bytes}, {"GBps", gbs}, {"frac_ceiling", gbs / ceiling},
                        {"splits", splits}});
        std::printf("%-14s %2d %7d %10.4f %10.0f %7.1f%% %8s\n", "fp16", B, T, fp16_ms, gbs,
                    100 * gbs / ceiling, "1.00x");
        CK(cudaFree(pool));
      }
      for (const Layout& lay : layouts) {
        auto rot = rotations_identityish(lay.L, rng);
        auto lvl = levels_for(lay.L);
        cuda::PackedPlan plan(lay.L, kHq, rot, lvl);
        uint8_t* pool;
        CK(cudaMalloc(&pool, n_pages * lay.L.page_bytes()));
        HostPagePool tmpl{&lay.L, std::vector<uint8_t>(64 * lay.L.page_bytes())};
        for (auto& x : tmpl.bytes) x = (uint8_t)rng();
        std::uniform_real_distribution<float> U(0.5f, 2.f);
        for (int p = 0; p < 64; ++p)
          for (int h = 0; h < kHkv; ++h)
            for (Side s : {Side::key, Side::value})
              for (int g = 0; g < (int)lay.L.head(h).side(s).size(); ++g)
                for (int t = 0; t < kPageTokens; ++t)
                  write_norm(lay.L, tmpl.page(p), h, s, g, t, fp32_to_fp16(U(rng)));
        fill_repeat(pool, n_pages * lay.L.page_bytes(), tmpl.bytes);
        const double ms = timer.median_ms(
            [&] {
              cuda::packed_decode_attention(plan, db, pool, dq, cuda::DType::f32, (float)scale,
                                            dout, ws, ws_bytes, splits, nullptr);
            },
            reps);
        double runtime_tables_ms = -1;
        if (lay.name == "K3V3")
          runtime_tables_ms = timer.median_ms(
              [&] {
                cuda::packed_decode_attention(plan, db, pool, dq, cuda::DType::f32, (float)scale,
                                              dout, ws, ws_bytes, splits, nullptr,
                                              cuda::PackedDecodeVariant::runtime_tables);
              },
              reps);
        const double bytes = (double)B * T * lay.L.page_bytes() / kPageTokens;
        const double gbs = bytes / (ms * 1e-3) / 1e9;
        // quantize-append of one token per sequence (all heads, one layer)
        std::vector<float> kv((size_t)B * kHkv * kD);
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
            [&] { cuda::packed_append(plan, ab, pool, dkv, dkv, cuda::DType::f32, nullptr); }, reps);
        rows.push_back({{"cache", lay.name}, {"B", B}, {"T", T}, {"ms", ms},
                        {"cache_bytes", bytes}, {"bytes_per_token_per_head", lay.L.bytes_per_token_per_head()},
                        {"GBps", gbs}, {"frac_ceiling", gbs / ceiling},
                        {"speedup_vs_fp16_kernel", fp16_ms / ms}, {"append_ms", append_ms}, {"runtime_tables_variant_ms", runtime_tables_ms},
                        {"splits", splits}});
        std::printf("%-14s %2d %7d %10.4f %10.0f %7.1f%% %7.2fx  (append %.4f ms)\n",
                    lay.name.c_str(), B, T, ms, gbs, 100 * gbs / ceiling, fp16_ms / ms, append_ms);
        CK(cudaFree(dkv));
        CK(cudaFree(dpos));
        CK(cudaFree(pool));
      }
      CK(cudaFree(ws));
      CK(cudaFree(dq));
      CK(cudaFree(dout));
      CK(cudaFree(dpt));
      CK(cudaFree(dlen));
    }
  }
  J["rows"] = rows;
  std::ofstream(out_path) << J.dump(2) << "\n";
  return 0;
}
