// bench_tasq_kmeans — one TaSQ codebook fit at the paper's shape (N = 40960
// points of dimension g = 8, K = 1024 centroids; docs/design.md §5.4): Faiss's
// k-means driven by faiss::IndexFlatL2 (the BLAS assignment, the baseline) and
// by ratekv's NearestCentroidIndex, same points, seed and iterations, in the
// same run. main() prints seconds per codebook and the speed ratio, in real
// time and in process CPU time (all threads), and the estimated k-means time
// of a whole SmolLM2 key fit (30 layers × 3 KV heads × 8 groups = 720
// codebooks at 20 iterations).
//   ./build/bench/bench_tasq_kmeans --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#ifdef RATEKV_HAVE_TASQ
#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>

#include "ratekv/quant/prng.h"
#include "ratekv/tasq/nearest_centroid_index.h"

namespace {

constexpr int kDim = 8, kCentroids = 1024, kIters = 5;
constexpr int64_t kPoints = 40960;

const std::vector<float>& points() {
  static const std::vector<float> x = [] {
    ratekv::quant::SplitMix64 rng(1);
    std::vector<float> v(kPoints * kDim);
    for (auto& e : v) e = static_cast<float>(rng.gaussian());
    return v;
  }();
  return x;
}

template <class IndexT>
void BM_KMeans(benchmark::State& st) {
  for (auto _ : st) {
    faiss::ClusteringParameters cp;
    cp.niter = kIters;
    cp.seed = 7;
    cp.max_points_per_centroid = 1 << 30;
    cp.min_points_per_centroid = 1;
    faiss::Clustering clus(kDim, kCentroids, cp);
    IndexT index(kDim);
    clus.train(kPoints, points().data(), index);
    benchmark::DoNotOptimize(clus.centroids.data());
    st.counters["objective"] = clus.iteration_stats.back().obj;
  }
}
BENCHMARK_TEMPLATE(BM_KMeans, faiss::IndexFlatL2)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
BENCHMARK_TEMPLATE(BM_KMeans, ratekv::tasq::NearestCentroidIndex)
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> real, cpu;  // name -> seconds per iteration
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs)
      if (!r.error_occurred && r.iterations > 0) {
        real[r.benchmark_name()] = r.real_accumulated_time / static_cast<double>(r.iterations);
        cpu[r.benchmark_name()] = r.cpu_accumulated_time / static_cast<double>(r.iterations);
      }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  const std::string base = "BM_KMeans<faiss::IndexFlatL2>/process_time/real_time";
  const std::string ours = "BM_KMeans<ratekv::tasq::NearestCentroidIndex>/process_time/real_time";
  for (const auto* t : {&rep.real, &rep.cpu}) {
    if (!t->count(base) || !t->count(ours)) continue;
    const double b = t->at(base), o = t->at(ours), per_fit = 720.0 * 20.0 / kIters;
    std::printf("\n%s: IndexFlatL2 %.3f s, NearestCentroidIndex %.3f s per codebook (%d iterations): x%.2f;"
                " a SmolLM2 key fit (720 codebooks, 20 iterations): %.0f s vs %.0f s\n",
                t == &rep.real ? "real time" : "process CPU time", b, o, kIters, b / o, b * per_fit, o * per_fit);
  }
  benchmark::Shutdown();
}
#else
int main() {
  std::fprintf(stderr, "bench_tasq_kmeans: built without TaSQ (LEMON/Faiss not found)\n");
  return 1;
}
#endif
