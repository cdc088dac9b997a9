// Exact nearest-centroid search for k-means assignment
// (ratekv/tasq/nearest_centroid_index.h).
#include "ratekv/tasq/nearest_centroid_index.h"

#include <faiss/impl/FaissAssert.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ratekv::tasq {

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
  // Scoring uses GCC/Clang vector extensions (8 float lanes: AVX2 with
  // -march=native, two SSE registers otherwise); kLanes = 2 such vectors.
  typedef float v8f __attribute__((vector_size(32)));
  typedef int32_t v8i __attribute__((vector_size(32)));
  static_assert(L == 16, "two v8f per block");
  const v8i iota = {0, 1, 2, 3, 4, 5, 6, 7};
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < n; ++p) {
    const float* xp = x + p * dim;
    const float inf = std::numeric_limits<float>::infinity();
    v8f best0 = {inf, inf, inf, inf, inf, inf, inf, inf}, best1 = best0;
    v8i arg0 = iota, arg1 = iota + 8;
    for (int64_t b = 0; b < nb; ++b) {
      v8f acc0, acc1;
      std::memcpy(&acc0, cn.data() + b * L, sizeof acc0);
      std::memcpy(&acc1, cn.data() + b * L + 8, sizeof acc1);
      for (int64_t i = 0; i < dim; ++i) {
        const float m2x = -2.0f * xp[i];
        v8f r0, r1;
        std::memcpy(&r0, ct.data() + (b * dim + i) * L, sizeof r0);
        std::memcpy(&r1, ct.data() + (b * dim + i) * L + 8, sizeof r1);
        acc0 += m2x * r0;
        acc1 += m2x * r1;
      }
      const int32_t base = static_cast<int32_t>(b * L);
      const v8i lt0 = acc0 < best0, lt1 = acc1 < best1;  // strict: the earlier block keeps a tie
      arg0 = lt0 ? iota + base : arg0;
      arg1 = lt1 ? iota + (base + 8) : arg1;
      best0 = lt0 ? acc0 : best0;
      best1 = lt1 ? acc1 : best1;
    }
    float best[L];
    int32_t arg[L];
    std::memcpy(best, &best0, sizeof best0);
    std::memcpy(best + 8, &best1, sizeof best1);
    std::memcpy(arg, &arg0, sizeof arg0);
    std::memcpy(arg + 8, &arg1, sizeof arg1);
    int jbest = 0;
    for (int j = 1; j < L; ++j)
      if (best[j] < best[jbest] || (best[j] == best[jbest] && arg[j] < arg[jbest])) jbest = j;
    float xn = 0.0f;
    for (int64_t i = 0; i < dim; ++i) xn += xp[i] * xp[i];
    distances[p] = std::max(best[jbest] + xn, 0.0f);  // as IndexFlatL2: rounding can go below 0
    labels[p] = arg[jbest];
  }
}

}  // namespace ratekv::tasq
