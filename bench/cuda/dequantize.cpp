// Chunked prefill's dequantizer on the GPU (issue 18): cuda::packed_dequantize
// in both variants (DequantVariant::fp32, the CUDA-core FMA kernel, and
// tensor_cores, the WMMA kernel) against cuda::fp16_read_tokens over the
// same tokens (what the fp16 cache's chunked prefill does instead), measured
// in the same run. Llama-3.1-8B KV shape (8 KV heads × head_dim 128) unless
// --kv-heads / --head-dim say otherwise; K3V3 (tq3, Haar rotations, the
// plan's Lloyd–Max levels) or, with --block-gtq, keys in 4/3/2-bit groups of
// 32/64/32 channels. Gaussian K/V written with packed_prefill (and
// fp16_write_tokens), pages in a shuffled order. Per token count N (one call
// = one key tile of N tokens; default 2048, 16384, 131072): median time of
// --reps calls (CUDA events), output GB/s (2 · N · Hkv · hd · 2 bytes), the
// ratios fp32 / tensor_cores and tensor_cores / fp16 read, and the largest
// |tensor_cores − fp32| over the row's group norm (DequantVariant's bound:
// ≈ 2.1 · 2⁻¹¹ ≈ 1e-3). Prints a table; exits 1 when that difference
// exceeds 2.2 · 2⁻¹¹. Not part of CI; run on the GPU machine:
//   build/bench/bench_cuda_dequant [--tokens 2048,16384,131072] [--reps 20]
// Exit codes: 0 done, 1 the difference above the bound or a runtime failure
// (no CUDA device, out of memory, a library error: one line
// "bench_cuda_dequant: <what>" on stderr), 2 bad arguments (the flag named,
// then the usage). --help prints the usage and exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/cuda/model_kernels.h"
#include "ratekv/engine/cache_format.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/model/synthetic.h"

namespace {

using namespace ratekv;

// A failed CUDA runtime call throws std::runtime_error naming the call, the
// CUDA error string and the line (main prints it as one line, exit 1).
#define CK(x)                                                                                      \
  do {                                                                                             \
    const cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess)                                                                         \
      throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_) + " (" + __FILE__ + \
                               ":" + std::to_string(__LINE__) + ")");                              \
  } while (0)

constexpr const char* kUsage =
    "usage: bench_cuda_dequant [--tokens N,N,...] [--reps R] [--kv-heads H] [--head-dim D] [--block-gtq] [--help]\n"
    "  --tokens    token counts, each 1..16777216 (default 2048,16384,131072)\n"
    "  --reps      timed calls per point, 1..10000 (median; default 20)\n"
    "  --kv-heads  KV heads, 1..64 (default 8; query heads are 4 per KV head)\n"
    "  --head-dim  64, 128 or 256 (default 128)\n"
    "  --block-gtq keys in 4/3/2-bit groups of 1/8, 1/4, 1/8 of the channel pairs (default K3V3)\n";

constexpr long long kMaxTokens = 1LL << 24;

/// Prints "bench_cuda_dequant: <flag>: <why>, got '<text>'" and the usage to
/// stderr and exits 2 (bad arguments).
[[noreturn]] void usage_error(const std::string& flag, const std::string& why, const std::string& text) {
  std::fprintf(stderr, "bench_cuda_dequant: %s: %s, got '%s'\n%s", flag.c_str(), why.c_str(), text.c_str(), kUsage);
  std::exit(2);
}

/// The whole of `text` as a decimal integer in lo..hi (no sign, no spaces, no
/// trailing characters, no overflow); usage_error naming `flag` otherwise.
int parse_int(const std::string& flag, const std::string& text, long long lo, long long hi) {
  long long v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  const auto r = std::from_chars(b, e, v);
  const std::string want = "expected a whole number in " + std::to_string(lo) + ".." + std::to_string(hi);
  if (text.empty() || !(text[0] >= '0' && text[0] <= '9') || r.ptr != e) usage_error(flag, want, text);
  if (r.ec == std::errc::result_out_of_range || v < lo || v > hi) usage_error(flag, want, text);
  return (int)v;
}

template <typename T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

template <typename F>
double median_ms(int reps, F&& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();  // warm-up (and the shared-memory attribute)
  CK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// "2048,16384" -> {2048, 16384}: every entry parse_int(flag, entry, 1, kMaxTokens)
/// (an empty entry, as in "2048,," or "", is refused).
std::vector<int> parse_list(const std::string& flag, const std::string& text) {
  std::vector<int> v;
  size_t p = 0;
  while (true) {
    const size_t c = text.find(',', p);
    v.push_back(parse_int(flag, text.substr(p, c == std::string::npos ? std::string::npos : c - p), 1, kMaxTokens));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  return v;
}

int run(int argc, char** argv) {
  std::vector<int> tokens = {2048, 16384, 131072};
  int reps = 20, Hkv = 8, hd = 128;
  bool block_gtq = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a, "needs a value", "");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--tokens") tokens = parse_list(a, next());
    else if (a == "--reps") reps = parse_int(a, next(), 1, 10000);
    else if (a == "--kv-heads") Hkv = parse_int(a, next(), 1, 64);
    else if (a == "--head-dim") {
      hd = parse_int(a, next(), 64, 256);
      if (hd != 64 && hd != 128 && hd != 256) usage_error(a, "expected 64, 128 or 256", argv[i]);
    } else if (a == "--block-gtq") block_gtq = true;
    else usage_error(a, "unknown argument", a);
  }
  // No GPU: refused here, before any plan or allocation (as bench_cuda_decode
  // asks for the device's properties first).
  int n_dev = 0;
  const cudaError_t de = cudaGetDeviceCount(&n_dev);
  if (de != cudaSuccess || n_dev < 1)
    throw std::runtime_error(std::string("no usable CUDA device (cudaGetDeviceCount: ") +
                             (de != cudaSuccess ? cudaGetErrorString(de) : "0 devices") + ")");
  ModelConfig c = synthetic_config("llama-3.1-8b", 1);
  c.head_dim = hd;
  c.n_kv_heads = Hkv;
  c.n_heads = 4 * Hkv;
  Plan plan = eval::cache_type_plan("tq3", "tq3", c, 3);
  if (block_gtq)
    for (auto& hp : plan.layers[0]) {
      Codec k;
      k.kind = CodecKind::TqMseGrouped;
      k.norm = NormStorage::FP16;
      CodecGroup g4, g3, g2;
      g4.bits = 4, g3.bits = 3, g2.bits = 2, g4.seed = 5, g3.seed = 6, g2.seed = 7;
      for (int b = 0; b < hd / 2; ++b) (b < hd / 8 ? g4 : b < 3 * hd / 8 ? g3 : g2).blocks.push_back(b);
      k.groups = {g4, g3, g2};
      hp.key = k;
    }
  auto codecs = std::make_shared<const cache::PlanCodecs>(plan, c);
  const engine::CacheFormat fmt = engine::CacheFormat::packed(codecs);
  const packed::LayerLayout& L = fmt.layout(0);
  cuda::PackedPlan pp(L, c.n_heads, fmt.rotations(0), fmt.levels(0));
  const int nmax = *std::max_element(tokens.begin(), tokens.end());
  const int n_pages = (nmax + 63) / 64, kvd = Hkv * hd;
  std::mt19937 g(7);
  std::vector<int32_t> pt(n_pages);
  for (int i = 0; i < n_pages; ++i) pt[i] = i;
  std::shuffle(pt.begin(), pt.end(), g);
  // K/V: Gaussian rows, generated in slices of 8192 tokens.
  uint8_t* pool = dev_alloc<uint8_t>((size_t)n_pages * L.page_bytes());
  const size_t fp16_page = (size_t)2 * Hkv * 64 * hd * 2;
  uint16_t* pool16 = dev_alloc<uint16_t>((size_t)n_pages * fp16_page / 2);
  int32_t* dpt = dev_alloc<int32_t>(n_pages);
  int32_t* start = dev_alloc<int32_t>(1);
  CK(cudaMemcpy(dpt, pt.data(), pt.size() * 4, cudaMemcpyHostToDevice));
  const int slice = 8192;
  float* dk = dev_alloc<float>((size_t)slice * kvd);
  float* dv = dev_alloc<float>((size_t)slice * kvd);
  std::normal_distribution<float> N01;
  std::vector<float> hk((size_t)slice * kvd), hv((size_t)slice * kvd);
  for (int t0 = 0; t0 < nmax; t0 += slice) {
    const int n = std::min(slice, nmax - t0);
    for (size_t i = 0; i < (size_t)n * kvd; ++i) hk[i] = N01(g), hv[i] = N01(g);
    CK(cudaMemcpy(dk, hk.data(), (size_t)n * kvd * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv.data(), (size_t)n * kvd * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(start, &t0, 4, cudaMemcpyHostToDevice));
    cuda::DecodeBatch db{dpt, n_pages, start, 1, t0 + n};
    cuda::packed_prefill(pp, db, pool, dk, dv, n, cuda::DType::f32, nullptr);
    cuda::fp16_write_tokens(pool16, Hkv, hd, dpt, n_pages, start, dk, dv, n, 1, nullptr);
  }
  CK(cudaDeviceSynchronize());
  uint16_t* k_tc = dev_alloc<uint16_t>((size_t)nmax * kvd);
  uint16_t* v_tc = dev_alloc<uint16_t>((size_t)nmax * kvd);
  uint16_t* k_32 = dev_alloc<uint16_t>((size_t)nmax * kvd);
  uint16_t* v_32 = dev_alloc<uint16_t>((size_t)nmax * kvd);

  // Largest |tensor_cores − fp32| per element over the norm of the row's
  // group (the fp32 variant's output as the reference; max over groups of a
  // side taken as the row's norm per side for simplicity: a looser
  // denominator only for multi-group sides), on the first 4096 tokens.
  const double u = std::ldexp(1.0, -11);
  double worst = 0;
  {
    const int n = std::min(nmax, 4096);
    cuda::packed_dequantize(pp, pool, dpt, n, k_tc, v_tc, nullptr, cuda::DequantVariant::tensor_cores);
    cuda::packed_dequantize(pp, pool, dpt, n, k_32, v_32, nullptr, cuda::DequantVariant::fp32);
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> a((size_t)n * kvd), b((size_t)n * kvd);
    for (int s = 0; s < 2; ++s) {
      CK(cudaMemcpy(a.data(), s ? v_tc : k_tc, a.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data(), s ? v_32 : k_32, b.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t r = 0; r < (size_t)n * Hkv; ++r) {
        const auto& groups = (s ? L.spec((int)(r % Hkv)).value : L.spec((int)(r % Hkv)).key);
        for (const auto& gs : groups) {
          double n2 = 0, e = 0;
          for (int ch : gs.channels) n2 += std::pow((double)fp16_to_fp32(b[r * hd + ch]), 2);
          for (int ch : gs.channels)
            e = std::max(e, std::fabs((double)fp16_to_fp32(a[r * hd + ch]) - fp16_to_fp32(b[r * hd + ch])));
          if (n2 > 0) worst = std::max(worst, e / std::sqrt(n2));
        }
      }
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("bench_cuda_dequant on %s: %s, Hkv %d, head_dim %d, %d reps (median)\n", prop.name,
              block_gtq ? "Block-GTQ keys 4/3/2 + V3" : "K3V3", Hkv, hd, reps);
  std::printf("max |tensor_cores - fp32| / group norm: %.3e (bound 2.1*2^-11 = %.3e)\n", worst, 2.1 * u);
  std::printf("%9s %12s %12s %12s %10s %10s %11s\n", "tokens", "fp32_ms", "tc_ms", "fp16read_ms", "tc_GB/s",
              "fp32/tc", "tc/fp16rd");
  for (int n : tokens) {
    const double f32 = median_ms(reps, [&] {
      cuda::packed_dequantize(pp, pool, dpt, n, k_32, v_32, nullptr, cuda::DequantVariant::fp32);
    });
    const double tc = median_ms(reps, [&] {
      cuda::packed_dequantize(pp, pool, dpt, n, k_tc, v_tc, nullptr, cuda::DequantVariant::tensor_cores);
    });
    const double rd = median_ms(reps, [&] { cuda::fp16_read_tokens(pool16, Hkv, hd, dpt, n, k_32, v_32, nullptr); });
    const double out_gb = 2.0 * n * kvd * 2 / 1e9;
    std::printf("%9d %12.4f %12.4f %12.4f %10.1f %10.2f %11.2f\n", n, f32, tc, rd, out_gb / (tc / 1e3), f32 / tc,
                tc / rd);
  }
  return worst <= 2.2 * u ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');  // one line
    std::fprintf(stderr, "bench_cuda_dequant: %s\n", what.c_str());
    return 1;
  }
}
