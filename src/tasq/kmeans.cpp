// k-means codebooks through Faiss (ratekv/tasq/kmeans.h).
#include "ratekv/tasq/kmeans.h"

#include <cmath>

#include <faiss/Clustering.h>
#include "ratekv/common/error.h"
#include "ratekv/tasq/nearest_centroid_index.h"

namespace ratekv::tasq {

std::vector<float> kmeans_codebook(const float* x, int64_t n, int dim, const std::vector<float>& weights,
                                   const KMeansOptions& opt) {
  check(dim >= 1, "kmeans: dimension {} must be ≥ 1", dim);
  check(opt.n_centroids >= 1 && opt.n_centroids <= 65536, "kmeans: {} centroids: expected 1..65536", opt.n_centroids);
  check(n >= opt.n_centroids, "kmeans: {} points for {} centroids (need at least as many points)", n,
        opt.n_centroids);
  check(opt.n_iter >= 1 && opt.n_iter <= 1000, "kmeans: {} iterations: expected 1..1000", opt.n_iter);
  check(weights.empty() || static_cast<int64_t>(weights.size()) == n, "kmeans: {} weights for {} points",
        weights.size(), n);
  for (int64_t i = 0; i < n * dim; ++i) check(std::isfinite(x[i]), "kmeans: point {} is not finite", i / dim);
  for (float w : weights) check(std::isfinite(w) && w >= 0.0f, "kmeans: weight {} must be finite and ≥ 0", w);
  // Faiss splits empty clusters by sampling a cluster with probability
  // (weight sum − 1)/(n − K): with tiny weights (squared gradients) no cluster
  // qualifies and it loops forever. Weights are only relative: rescale them
  // to mean 1 (weight sums then behave like counts).
  std::vector<float> w;
  if (!weights.empty()) {
    double mean = 0.0;
    for (float x : weights) mean += x;
    mean /= static_cast<double>(n);
    check(mean > 0.0, "kmeans: all weights are 0");
    w.resize(weights.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(weights[i] / mean);
  }
  faiss::ClusteringParameters cp;
  cp.niter = opt.n_iter;
  cp.seed = static_cast<int>(opt.seed & 0x7fffffff);
  cp.verbose = false;
  cp.max_points_per_centroid = 1 << 30;  // never subsample
  cp.min_points_per_centroid = 1;        // ≈ 39 points per centroid is the plan; no warning
  faiss::Clustering clus(dim, opt.n_centroids, cp);
  NearestCentroidIndex index(dim);  // exact assignment without the BLAS distance matrix
  try {
    clus.train(n, x, index, w.empty() ? nullptr : w.data());
  } catch (const std::exception& e) {
    fail("kmeans: Faiss failed: {}", e.what());
  }
  check(clus.centroids.size() == static_cast<size_t>(opt.n_centroids) * dim, "kmeans: Faiss returned {} values",
        clus.centroids.size());
  return clus.centroids;
}

}  // namespace ratekv::tasq
