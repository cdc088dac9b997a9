// The packed cache's scalar attention path (include/ratekv/cache/
// packed_kv_cache.h): codes unpacked per page (unpack_codes), keys scored
// from a per-step table (decode rows) or a levels tile (prefill rows), values
// accumulated from a levels tile. Serves every width (1..8 bits) and builds
// without AVX2; PackedCacheOptions::reference_attention forces it, and the
// fast path (packed_attention_avx2.cpp) is tested against it.
#include "packed_attention_kernels.h"

namespace ratekv::cache::detail {

using packed::kPageTokens;

void build_key_table(const float* q_rot, int dim, int bits, const float* levels, std::vector<float>& tab) {
  const int nl = 1 << bits;
  tab.resize(static_cast<size_t>(dim) * nl);
  for (int i = 0; i < dim; ++i)
    for (int j = 0; j < nl; ++j) tab[i * nl + j] = q_rot[i] * levels[j];
}

void lut_key_scores(const PageGroup& G, const uint8_t* codes, const float* nrm, const float* tab, int u0, int u1,
                    float* S_r) {
  const int nl = 1 << G.bits;
  for (int u = u0; u < u1; ++u) {
    const uint8_t* cu = codes + static_cast<size_t>(u) * G.dim_pad;
    // Four independent partial sums: the table lookups are not
    // serialized behind one add chain. dim is even (RoPE pairs or
    // head_dim); the padded tail codes are 0 but never read.
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int i = 0;
    for (; i + 4 <= G.dim; i += 4) {
      a0 += tab[i * nl + cu[i]];
      a1 += tab[(i + 1) * nl + cu[i + 1]];
      a2 += tab[(i + 2) * nl + cu[i + 2]];
      a3 += tab[(i + 3) * nl + cu[i + 3]];
    }
    for (; i < G.dim; ++i) a0 += tab[i * nl + cu[i]];
    S_r[u - u0] += nrm[u] * ((a0 + a1) + (a2 + a3));
  }
}

void tile_key_scores(const PageGroup& G, const uint8_t* codes, const float* nrm, const float* q_rot, int qstride,
                     int64_t R, int u0, int u1, float* tile, float* S) {
  // Transposed levels tile with the norms folded in, tile[i][u] =
  // n_u·c[idx_{u,i}], then S[r] += Σ_i q_rot[r][i]·tile[i] (axpy over
  // the page's tokens: contiguous, vectorizes without reassociation).
  const int nu = u1 - u0;
  for (int u = u0; u < u1; ++u) {
    const uint8_t* cu = codes + static_cast<size_t>(u) * G.dim_pad;
    for (int i = 0; i < G.dim; ++i) tile[static_cast<size_t>(i) * kPageTokens + (u - u0)] = G.levels[cu[i]] * nrm[u];
  }
  for (int64_t r = 0; r < R; ++r) {
    float* __restrict sr = S + r * kPageTokens;
    const float* qr = q_rot + r * qstride;
    for (int i = 0; i < G.dim; ++i) {
      const float qi = qr[i];
      const float* __restrict ti = tile + static_cast<size_t>(i) * kPageTokens;
      for (int u = 0; u < nu; ++u) sr[u] += qi * ti[u];
    }
  }
}

void scalar_value_accumulate(const PageGroup& G, const uint8_t* codes, const float* S, int64_t R, int u0, int u1,
                             float* tile, float* o_rows, int ostride) {
  const int nu = u1 - u0;
  for (int u = u0; u < u1; ++u) {
    const float n = norm_at(G.page, G.norm_offset, u);
    const uint8_t* cu = codes + static_cast<size_t>(u) * G.dim_pad;
    float* tu = tile + static_cast<size_t>(u - u0) * G.dim;
    for (int i = 0; i < G.dim; ++i) tu[i] = G.levels[cu[i]] * n;
  }
  for (int64_t r = 0; r < R; ++r) {
    const float* pr = S + r * kPageTokens;
    float* __restrict o = o_rows + r * ostride;
    for (int u = 0; u < nu; ++u) {
      const float w = pr[u];
      if (w == 0.0f) continue;  // masked (or underflowed) token
      const float* __restrict tu = tile + static_cast<size_t>(u) * G.dim;
      for (int i = 0; i < G.dim; ++i) o[i] += w * tu[i];
    }
  }
}

}  // namespace ratekv::cache::detail
