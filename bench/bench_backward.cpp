// bench_backward — cost of the K/V backward pass (model_backward.h) on the
// real SmolLM2-135M-Instruct Q4_1 model ($RATEKV_ASSETS/models/...; skipped
// with an error message when absent), against the plain forward pass of the
// same tokens measured in the same run:
//
//   BM_Forward/N   : Model::forward of N tokens from an empty fp32 cache, all
//                    logits (the baseline);
//   BM_Loss/N      : ModelBackward<float>::loss (taped forward + loss);
//   BM_Backward/N  : ModelBackward<float>::backward (loss + ∂L/∂K, ∂L/∂V of all
//                    layers; each layer recomputed from its checkpoint).
//
// After the run it prints time(Loss)/time(Forward) and
// time(Backward)/time(Forward) per N. `ratekv calibrate --sensitivity` costs
// 16 × BM_Backward/512. Token ids are a fixed pseudo-random sequence.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

#include "support/default_model.h"
#include "ratekv/model/backward.h"

namespace {

using ratekv_bench::model;
using ratekv_bench::model_path;
using ratekv_bench::token_ids;

// Mean seconds per iteration by (benchmark name, N), for the ratio table.
std::map<std::pair<std::string, int64_t>, double> g_seconds;

template <class F>
void timed(benchmark::State& state, const char* name, F&& body) {
  double total = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++iters;
  }
  if (iters) g_seconds[{name, state.range(0)}] = total / static_cast<double>(iters);
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(state.range(0)) * static_cast<double>(iters), benchmark::Counter::kIsRate);
}

void BM_Forward(benchmark::State& state) {
  ratekv::Model* m = model();
  if (!m) return state.SkipWithError(("model not found: " + model_path()).c_str());
  const auto tokens = token_ids(state.range(0), m->config().n_vocab);
  std::vector<float> logits(tokens.size() * m->config().n_vocab);
  timed(state, "Forward", [&] {
    ratekv::DenseKVCache cache = m->make_dense_cache(state.range(0));
    m->forward(tokens, 0, cache, logits.data(), true);
    benchmark::DoNotOptimize(logits.data());
  });
}

void BM_Loss(benchmark::State& state) {
  ratekv::Model* m = model();
  if (!m) return state.SkipWithError(("model not found: " + model_path()).c_str());
  const auto tokens = token_ids(state.range(0), m->config().n_vocab);
  const ratekv::ModelBackward<float> bw(*m);
  timed(state, "Loss", [&] { benchmark::DoNotOptimize(bw.loss(tokens)); });
}

void BM_Backward(benchmark::State& state) {
  ratekv::Model* m = model();
  if (!m) return state.SkipWithError(("model not found: " + model_path()).c_str());
  const auto tokens = token_ids(state.range(0), m->config().n_vocab);
  const ratekv::ModelBackward<float> bw(*m);
  timed(state, "Backward", [&] {
    double s = 0;
    benchmark::DoNotOptimize(bw.backward(tokens, [&](const ratekv::LayerKVGrad<float>& g) { s += g.dv[0]; }));
    benchmark::DoNotOptimize(s);
  });
}

BENCHMARK(BM_Forward)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Loss)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Backward)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (int64_t n : {128, 512}) {
    const auto f = g_seconds.find({"Forward", n});
    if (f == g_seconds.end()) continue;
    for (const char* name : {"Loss", "Backward"}) {
      const auto b = g_seconds.find({name, n});
      if (b != g_seconds.end()) std::printf("N=%lld  %s / Forward = %.2f\n", static_cast<long long>(n), name, b->second / f->second);
    }
  }
  return 0;
}
