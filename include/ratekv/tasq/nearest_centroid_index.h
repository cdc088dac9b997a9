// ratekv/tasq/nearest_centroid_index.h — the assignment step of TaSQ/CQ
// k-means: exact nearest centroid in small dimensions (docs/design.md §5.4).
//
// faiss::Clustering drives the k-means (initialization, Lloyd iterations,
// weights, empty-cluster splitting); every iteration it asks an index for the
// nearest centroid of each point (search with k = 1). faiss::IndexFlatL2
// answers through a BLAS product (N × K distance blocks written to memory and
// scanned again), which at TaSQ's shapes (dim = g = 8, K = 1024, N ≈ 40K)
// is memory-bound: ≈ 2.5 s per codebook on 2 cores, ≈ 30 min for the 720
// codebooks of SmolLM2. This index computes the same argmin in registers:
// centroids transposed in blocks of kLanes, ‖c‖² − 2⟨x, c⟩ per lane (the
// ‖x‖² term is added once per point), the minimum kept per lane, points in
// parallel (OpenMP). Same answer as IndexFlatL2 up to float rounding of
// near-ties (the distance is computed in the same expanded form).
#pragma once

#include <faiss/IndexFlat.h>

#include <vector>

namespace ratekv::tasq {

/// An exact L2 index for k-means assignment (search with k = 1 only).
/// Storage and add/reset are IndexFlatL2's (centroids row-major (K, d));
/// search(n, x (n, d) row-major, 1, distances (n), labels (n)) returns for
/// each point the squared L2 distance to the nearest stored vector and its
/// id, ties → the lowest id. Throws faiss::FaissException (Clustering turns
/// it into its own error) for k ≠ 1, search parameters, or an empty index —
/// there is no silent fallback to the BLAS path.
struct NearestCentroidIndex : faiss::IndexFlatL2 {
  static constexpr int kLanes = 16;  ///< centroids scored together (two AVX2 / one AVX-512 register)

  explicit NearestCentroidIndex(faiss::Index::idx_t d) : faiss::IndexFlatL2(d) {}

  void search(faiss::Index::idx_t n, const float* x, faiss::Index::idx_t k, float* distances, faiss::Index::idx_t* labels,
              const faiss::SearchParameters* params = nullptr) const override;
};

}  // namespace ratekv::tasq
