// ratekv/tasq/kmeans.h — k-means codebooks for vq codecs (Faiss).
#pragma once

#include <cstdint>
#include <vector>

namespace ratekv::tasq {

struct KMeansOptions {
  int n_centroids = 1024;  ///< K
  int n_iter = 20;         ///< Lloyd iterations
  uint64_t seed = 0;       ///< Faiss initialization seed (random K points)
};

/// Weighted k-means (Lloyd) of n points of dimension dim (x row-major (n,
/// dim)) into K centroids (K, dim) with faiss::Clustering over an exact L2
/// index (NearestCentroidIndex, tasq/nearest_centroid_index.h); `weights` (n) or empty = unweighted (only relative: rescaled to
/// mean 1 before Faiss, whose empty-cluster split needs count-like sums). Every point is used (no
/// subsampling). Deterministic for a fixed seed (the assignment is per point, so
/// independent of the thread count). Throws
/// Error for n < K, dim < 1, a negative/non-finite weight, or non-finite
/// points.
std::vector<float> kmeans_codebook(const float* x, int64_t n, int dim, const std::vector<float>& weights,
                                   const KMeansOptions& opt);

}  // namespace ratekv::tasq
