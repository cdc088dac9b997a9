// bench_forward — prefill and decode speed of the fp32 CPU forward pass on the
// real SmolLM2-135M-Instruct Q4_1 model ($RATEKV_ASSETS/models/...; every
// benchmark is skipped with an error message when it is absent).
//
//   BM_Prefill/512, /2048 : one forward of N tokens from an empty cache;
//                           counter tokens_per_second = N / time.
//   BM_Decode/512, /2048  : 16 single-token forwards after a prefill of depth
//                           N (the prefilled cache is copied outside the timed
//                           region); counter tokens_per_second = 16 / time.
//
// Token ids are a fixed pseudo-random sequence (speed does not depend on them).
// JSON for tools/bench_vs_llamacpp.sh:
//   bench_forward --benchmark_format=json --benchmark_out=forward.json
// llama-bench's pp512/pp2048 and tg at depth (-d) measure the same quantities.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>

#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

#include "support/default_model.h"

namespace {

using ratekv_bench::model;
using ratekv_bench::model_path;
using ratekv_bench::token_ids;

void BM_Prefill(benchmark::State& state) {
  ratekv::Model* m = model();
  if (!m) {
    state.SkipWithError(("model not found: " + model_path()).c_str());
    return;
  }
  const int64_t n = state.range(0);
  const auto toks = token_ids(n, m->config().n_vocab);
  std::vector<float> logits(m->config().n_vocab);
  auto cache = m->make_dense_cache(n);
  for (auto _ : state) {
    state.PauseTiming();
    cache.clear();
    state.ResumeTiming();
    m->forward(toks, 0, cache, logits.data(), false);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Decode(benchmark::State& state) {
  ratekv::Model* m = model();
  if (!m) {
    state.SkipWithError(("model not found: " + model_path()).c_str());
    return;
  }
  const int64_t depth = state.range(0), steps = 16;
  const auto toks = token_ids(depth + steps, m->config().n_vocab);
  std::vector<float> logits(m->config().n_vocab);
  auto prefilled = m->make_dense_cache(depth + steps);
  m->forward(std::span<const int32_t>(toks).subspan(0, depth), 0, prefilled, nullptr, false);
  for (auto _ : state) {
    state.PauseTiming();
    ratekv::DenseKVCache cache = prefilled;
    state.ResumeTiming();
    for (int64_t i = 0; i < steps; ++i) {
      m->forward(std::span<const int32_t>(toks).subspan(depth + i, 1), depth + i, cache, logits.data(), false);
    }
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(steps), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_Prefill)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_Decode)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

BENCHMARK_MAIN();
