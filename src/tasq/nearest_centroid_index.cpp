// Exact nearest-centroid search for k-means assignment
// (ratekv/tasq/nearest_centroid_index.h).
#include "ratekv/tasq/nearest_centroid_index.h"

#include <faiss/impl/FaissAssert.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ratekv::tasq {

namespace {

// Scoring uses GCC/Clang vector extensions (8 float lanes: AVX2 with
// -march=native, two SSE registers otherwise); kLanes = 2 such vectors.
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
static_assert(NearestCentroidIndex::kLanes == 16, "two v8f per lane block");

constexpr int kPointsPerPass = 4;  // points scored together: each centroid load feeds 4 FMAs

// Nearest centroid of NP points x (NP, dim): ct (nb, dim, 16) transposed
// centroids, cn (nb, 16) their squared norms (+∞ in padding lanes). Writes
// dis (NP) squared distances (clamped at 0) and lab (NP) ids, ties → lowest id.
template <int NP>
void nearest(const float* x, int64_t dim, const float* ct, const float* cn, int64_t nb, float* dis,
             faiss::Index::idx_t* lab) {
  constexpr int L = NearestCentroidIndex::kLanes;
  const float inf = std::numeric_limits<float>::infinity();
  const v8i iota = {0, 1, 2, 3, 4, 5, 6, 7};
  v8f best[NP][2];
  v8i arg[NP][2];
  for (int q = 0; q < NP; ++q) {
    best[q][0] = best[q][1] = v8f{inf, inf, inf, inf, inf, inf, inf, inf};
    arg[q][0] = iota;
    arg[q][1] = iota + 8;
  }
  for (int64_t b = 0; b < nb; ++b) {
    v8f c0, c1;
    std::memcpy(&c0, cn + b * L, sizeof c0);
    std::memcpy(&c1, cn + b * L + 8, sizeof c1);
    v8f acc[NP][2];
    for (int q = 0; q < NP; ++q) acc[q][0] = c0, acc[q][1] = c1;
    for (int64_t i = 0; i < dim; ++i) {
      v8f r0, r1;
      std::memcpy(&r0, ct + (b * dim + i) * L, sizeof r0);
      std::memcpy(&r1, ct + (b * dim + i) * L + 8, sizeof r1);
      for (int q = 0; q < NP; ++q) {
        const float m2x = -2.0f * x[q * dim + i];
        acc[q][0] += m2x * r0;
        acc[q][1] += m2x * r1;
      }
    }
    const int32_t base = static_cast<int32_t>(b * L);
    for (int q = 0; q < NP; ++q) {
      const v8i lt0 = acc[q][0] < best[q][0], lt1 = acc[q][1] < best[q][1];  // strict: earlier block keeps a tie
      arg[q][0] = lt0 ? iota + base : arg[q][0];
      arg[q][1] = lt1 ? iota + (base + 8) : arg[q][1];
      best[q][0] = lt0 ? acc[q][0] : best[q][0];
      best[q][1] = lt1 ? acc[q][1] : best[q][1];
    }
  }
  for (int q = 0; q < NP; ++q) {
    float bv[L];
    int32_t av[L];
    std::memcpy(bv, &best[q][0], sizeof(v8f));
    std::memcpy(bv + 8, &best[q][1], sizeof(v8f));
    std::memcpy(av, &arg[q][0], sizeof(v8i));
    std::memcpy(av + 8, &arg[q][1], sizeof(v8i));
    int jb = 0;
    for (int j = 1; j < L; ++j)
      if (bv[j] < bv[jb] || (bv[j] == bv[jb] && av[j] < av[jb])) jb = j;
    float xn = 0.0f;
    for (int64_t i = 0; i < dim; ++i) xn += x[q * dim + i] * x[q * dim + i];
    dis[q] = std::max(bv[jb] + xn, 0.0f);  // as IndexFlatL2: rounding can go below 0
    lab[q] = av[jb];
  }
}

}  // namespace

void NearestCentroidIndex::search(faiss::Index::idx_t n, const float* x, faiss::Index::idx_t k, float* distances,
                                  faiss::Index::idx_t* labels, const faiss::SearchParameters* params) const {
  FAISS_THROW_IF_NOT_MSG(k == 1, "NearestCentroidIndex: only k = 1 (k-means assignment) is supported");
  FAISS_THROW_IF_NOT_MSG(params == nullptr, "NearestCentroidIndex: search parameters are not supported");
  FAISS_THROW_IF_NOT_MSG(ntotal > 0, "NearestCentroidIndex: search on an empty index");
  constexpr int L = kLanes;
  const int64_t dim = d, K = ntotal, nb = (K + L - 1) / L;
  const float* xb = get_xb();
  // ct[(b·dim + i)·L + j] = coordinate i of centroid b·L + j; cn = ‖c‖²
  // (+∞ in the padding lanes of the last block, so they never win).
  std::vector<float> ct(static_cast<size_t>(nb * dim * L), 0.0f);
  std::vector<float> cn(static_cast<size_t>(nb * L), std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < K; ++c) {
    const int64_t b = c / L, j = c % L;
    float nrm = 0.0f;
    for (int64_t i = 0; i < dim; ++i) {
      const float v = xb[c * dim + i];
      ct[(b * dim + i) * L + j] = v;
      nrm += v * v;
    }
    cn[b * L + j] = nrm;
  }
#pragma omp parallel for schedule(static)
  for (int64_t p0 = 0; p0 < n; p0 += kPointsPerPass) {
    if (n - p0 >= kPointsPerPass) {
      nearest<kPointsPerPass>(x + p0 * dim, dim, ct.data(), cn.data(), nb, distances + p0, labels + p0);
    } else {
      for (int64_t p = p0; p < n; ++p) nearest<1>(x + p * dim, dim, ct.data(), cn.data(), nb, distances + p, labels + p);
    }
  }
}

}  // namespace ratekv::tasq
