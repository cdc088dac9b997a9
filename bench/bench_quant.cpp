// bench_quant — TQ-MSE encode / decode throughput (vectors/s) for m = 64, 128
// at 2/3/4 bits, Haar and Hadamard rotations, against a plain fp32→fp16 copy
// of the same vectors measured in the same run (counter vs_fp16_copy = this
// benchmark's vectors/s divided by the copy's, both from thread CPU time so a
// loaded machine does not skew the ratio). The copy uses F16C (vcvtps2ph)
// when compiled with it, else the scalar fp32_to_fp16. Encode = norm, rotate,
// Lloyd–Max search, bit-pack; decode = unpack, lookup, inverse rotation.
//   ./build/bench_quant --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <time.h>
#include <map>
#include <vector>

#include <immintrin.h>

#include "ratekv/common/fp16.h"
#include "ratekv/quant/prng.h"
#include "ratekv/quant/tq_mse.h"

using namespace ratekv;
using namespace ratekv::quant;

namespace {

constexpr int64_t kVectors = 2048;  // per iteration; ~1 MB of fp32 at m = 128 (fits in L2/L3)
std::map<int, double> g_copy_rate;  // m -> vectors/s of the fp16 copy

std::vector<float> make_data(int m) {
  SplitMix64 rng(1);
  std::vector<float> x(kVectors * m);
  for (auto& v : x) v = (float)rng.gaussian();
  return x;
}

// Thread CPU time in seconds.
double now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

void to_fp16(const float* x, uint16_t* out, size_t n) {
  size_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) out[i] = fp32_to_fp16(x[i]);
}

void report(benchmark::State& state, int m, double seconds, int64_t vectors) {
  state.SetItemsProcessed(vectors);
  const double rate = vectors / seconds;
  if (g_copy_rate.count(m)) state.counters["vs_fp16_copy"] = rate / g_copy_rate[m];
}

void BM_fp16_copy(benchmark::State& state) {
  const int m = (int)state.range(0);
  auto x = make_data(m);
  std::vector<uint16_t> out(x.size());
  int64_t vectors = 0;
  const double t0 = now();
  for (auto _ : state) {
    to_fp16(x.data(), out.data(), x.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    vectors += kVectors;
  }
  const double dt = now() - t0;
  state.SetItemsProcessed(vectors);
#ifdef __F16C__
  state.SetLabel("f16c");
#else
  state.SetLabel("scalar");
#endif
  g_copy_rate[m] = vectors / dt;
}

void BM_tq_mse_encode(benchmark::State& state) {
  const int m = (int)state.range(0), b = (int)state.range(1);
  const auto rot = state.range(2) ? RotationKind::hadamard : RotationKind::haar;
  state.SetLabel(to_string(rot));
  TQMSE q({.dim = m, .bits = b, .seed = 7, .rotation = rot});
  auto x = make_data(m);
  const size_t cb = q.packed_code_bytes();
  std::vector<uint8_t> codes(kVectors * cb);
  std::vector<uint16_t> norms(kVectors);
  int64_t vectors = 0;
  const double t0 = now();
  for (auto _ : state) {
    for (int64_t t = 0; t < kVectors; ++t) norms[t] = fp32_to_fp16(q.encode_packed(&x[t * m], &codes[t * cb]));
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
    vectors += kVectors;
  }
  report(state, m, now() - t0, vectors);
}

void BM_tq_mse_decode(benchmark::State& state) {
  const int m = (int)state.range(0), b = (int)state.range(1);
  const auto rot = state.range(2) ? RotationKind::hadamard : RotationKind::haar;
  state.SetLabel(to_string(rot));
  TQMSE q({.dim = m, .bits = b, .seed = 7, .rotation = rot});
  auto x = make_data(m);
  const size_t cb = q.packed_code_bytes();
  std::vector<uint8_t> codes(kVectors * cb);
  std::vector<float> norms(kVectors), out(x.size());
  for (int64_t t = 0; t < kVectors; ++t) norms[t] = q.encode_packed(&x[t * m], &codes[t * cb]);
  int64_t vectors = 0;
  const double t0 = now();
  for (auto _ : state) {
    for (int64_t t = 0; t < kVectors; ++t) q.decode_packed(&codes[t * cb], norms[t], &out[t * m]);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    vectors += kVectors;
  }
  report(state, m, now() - t0, vectors);
}

// Registration order = run order: the copy baseline for each m runs first.
BENCHMARK(BM_fp16_copy)->Arg(64)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_tq_mse_encode)->ArgsProduct({{64, 128}, {2, 3, 4}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_tq_mse_decode)->ArgsProduct({{64, 128}, {2, 3, 4}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
