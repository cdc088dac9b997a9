// bench_packed_decode — decode speed of the packed KV cache (attention from
// codes, ratekv/cache/packed_kv_cache.h) against the fp32 DenseKVCache, same
// run, SmolLM2-135M shapes (30 layers, 9 query heads, 3 KV heads, head_dim 64).
//
// For each context length (1K, 4K, 8K) both caches are filled with the same
// synthetic K/V (Gaussian with per-channel scales, appended in 512-token
// prefill chunks), then:
//   BM_Attend/<cache>/<ctx>  one decode step of attention only: attend() of
//                            one query on every layer (tokens/s = 1 / time)
//   BM_Decode/<cache>/<ctx>  one full model decode step (forward of 1 token:
//                            projections, cache append + attention, FFN, LM
//                            head), only when the model asset exists
//                            ($RATEKV_ASSETS/models/SmolLM2-135M-Instruct.Q4_1.gguf)
// Caches: fp32, packed uniform TQ-MSE K3V3 and K2V2 (plans built in code,
// AVX2 decode fast path), and packed K3V3 through the scalar reference
// attention (PackedCacheOptions::reference_attention: unpack + table
// lookups), so the fast path's gain is measured in the same run.
// Times: real time and process CPU time (all OpenMP threads); main() prints
// tokens/s and the packed/fp32 ratios per context for both.
//   OMP_WAIT_POLICY=passive ./build/bench_packed_decode --benchmark_min_time=1
//   (--benchmark_out=FILE.json --benchmark_out_format=json for the raw runs)
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include <fmt/format.h>

#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

using namespace ratekv;

namespace {

ModelConfig smollm2_shape() {
  ModelConfig c;
  c.arch = "llama";
  c.n_layers = 30;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.d_model = 576;
  c.d_ff = 1536;
  c.n_vocab = 49152;
  c.n_ctx_train = 8192;
  c.rope_theta = 100000.0;
  c.rms_eps = 1e-5f;
  return c;
}

std::unique_ptr<Model> g_model;  // loaded once if the asset exists

std::string model_path() {
  const char* env = std::getenv("RATEKV_ASSETS");
  const char* home = std::getenv("HOME");
  const std::string root = env ? env : std::string(home ? home : ".") + "/.cache/ratekv/assets";
  return root + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::shared_ptr<const cache::PlanCodecs> uniform_codecs(const ModelConfig& cfg, int bits) {
  Plan p;
  p.method = "uniform";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.budget_k = p.budget_v = bits + 16.0 / cfg.head_dim;
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads));
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h)
      p.layers[l][h] = {Codec::tq_mse(bits, cfg.head_dim, 1000 + 2 * (l * 8 + h)),
                        Codec::tq_mse(bits, cfg.head_dim, 1001 + 2 * (l * 8 + h))};
  return std::make_shared<cache::PlanCodecs>(p, cfg, "bench-plan");
}

// kind 0 = fp32, 1 = packed K3V3, 2 = packed K2V2, 3 = packed K3V3 scalar reference.
const char* kKindNames[] = {"fp32", "packed_k3v3", "packed_k2v2", "packed_k3v3_ref"};
constexpr int kKinds = 4;

std::unique_ptr<KVCache> filled_cache(int kind, const ModelConfig& cfg, int64_t ctx) {
  const KVCacheShape shape = cfg.kv_shape(ctx + 4096);
  std::unique_ptr<KVCache> c;
  if (kind == 0)
    c = std::make_unique<DenseKVCache>(shape);
  else {
    cache::PackedCacheOptions opt;
    opt.reference_attention = kind == 3;
    c = std::make_unique<cache::PackedKVCache>(shape, uniform_codecs(cfg, kind == 2 ? 2 : 3), opt);
  }
  const int64_t row = int64_t{cfg.n_kv_heads} * cfg.head_dim, chunk = 512;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(chunk * row), v(chunk * row);
  std::vector<int32_t> pos(chunk);
  for (int64_t t0 = 0; t0 < ctx; t0 += chunk) {
    const int64_t n = std::min(chunk, ctx - t0);
    for (int64_t i = 0; i < n * row; ++i) {
      k[i] = nd(rng) * (0.5f + (i % cfg.head_dim) / 16.0f);
      v[i] = nd(rng);
    }
    for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(t0 + i);
    for (int l = 0; l < cfg.n_layers; ++l) c->append(l, n, pos.data(), k.data(), k.data(), v.data());
  }
  return c;
}

void BM_Attend(benchmark::State& st) {
  const int kind = static_cast<int>(st.range(0));
  const int64_t ctx = st.range(1);
  const ModelConfig cfg = smollm2_shape();
  auto c = filled_cache(kind, cfg, ctx);
  std::vector<float> q(cfg.n_heads * cfg.head_dim), out(q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : q) x = nd(rng);
  const int32_t p = static_cast<int32_t>(ctx - 1);
  AttnParams ap;
  ap.scale = 0.125f;
  for (auto _ : st) {
    for (int l = 0; l < cfg.n_layers; ++l) c->attend(l, 1, &p, q.data(), out.data(), ap);
    benchmark::DoNotOptimize(out.data());
  }
  st.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["cache_MiB"] = c->bytes() / 1048576.0;
  st.SetLabel(kKindNames[kind]);
}

void BM_Decode(benchmark::State& st) {
  if (!g_model) {
    st.SkipWithError(("model asset missing: " + model_path()).c_str());
    return;
  }
  const int kind = static_cast<int>(st.range(0));
  const int64_t ctx = st.range(1);
  const ModelConfig& cfg = g_model->config();
  auto c = filled_cache(kind, cfg, ctx);
  std::vector<float> logits(cfg.n_vocab);
  int64_t pos = ctx;
  const int32_t tok = 1234;
  for (auto _ : st) {
    if (pos >= c->shape().n_ctx) {  // keep the context (almost) fixed: refill
      st.PauseTiming();
      c = filled_cache(kind, cfg, ctx);
      pos = ctx;
      st.ResumeTiming();
    }
    g_model->forward(std::span<const int32_t>(&tok, 1), pos++, *c, logits.data(), false);
  }
  st.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.SetLabel(kKindNames[kind]);
}

void args(benchmark::internal::Benchmark* b) {
  for (int64_t ctx : {1024, 4096, 8192})
    for (int kind = 0; kind < kKinds; ++kind) b->Args({kind, ctx});
  b->ArgNames({"cache", "ctx"})->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
}
BENCHMARK(BM_Attend)->Apply(args);
BENCHMARK(BM_Decode)->Apply(args);

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> seconds, cpu_seconds;  // benchmark name -> seconds per iteration
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs)
      if (!r.error_occurred && r.iterations > 0) {
        seconds[r.benchmark_name()] = r.real_accumulated_time / static_cast<double>(r.iterations);
        cpu_seconds[r.benchmark_name()] = r.cpu_accumulated_time / static_cast<double>(r.iterations);
      }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (std::filesystem::exists(model_path())) {
    GgufFile f = GgufFile::open(model_path());
    g_model = std::make_unique<Model>(Model::load(f));
    g_model->set_position_limit(8192 + 4096);  // the benchmark decodes a little past 8K
  }
  RatioReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  for (const auto* table : {&rep.seconds, &rep.cpu_seconds}) {
    std::printf("\ndecode tokens/s and speed ratio packed / fp32 (same run, %s):\n",
                table == &rep.seconds ? "real time" : "process CPU time, all threads");
    for (const char* bm : {"BM_Attend", "BM_Decode"})
      for (int64_t ctx : {1024, 4096, 8192}) {
        auto name = [&](int kind) { return fmt::format("{}/cache:{}/ctx:{}/process_time/real_time", bm, kind, ctx); };
        const auto base = table->find(name(0));
        if (base == table->end()) continue;
        std::printf("  %-9s ctx %5lld: fp32 %7.1f tok/s", bm, static_cast<long long>(ctx), 1.0 / base->second);
        for (int kind = 1; kind < kKinds; ++kind) {
          const auto it = table->find(name(kind));
          if (it != table->end())
            std::printf(" | %s %7.1f (x%.2f)", kKindNames[kind], 1.0 / it->second, base->second / it->second);
        }
        std::printf("\n");
      }
  }
  benchmark::Shutdown();
}
