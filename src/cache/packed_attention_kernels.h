// Internal to src/cache: what the packed cache's storage
// (packed_kv_cache.cpp), its attention driver (packed_attention.cpp) and its
// two per-page attention paths share — the AVX2 fast path
// (packed_attention_avx2.cpp) and the scalar path (packed_attention_scalar.cpp),
// both described in include/ratekv/cache/packed_kv_cache.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#define RATEKV_PACKED_FAST 1
#endif

#include "ratekv/common/fp16.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/model/attention_state.h"
#include "ratekv/model/kv_cache.h"

namespace ratekv::cache::detail {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Query rows per KV head up to which keys are scored with the per-step table
// (decode); above it, per-page levels tiles and axpy loops (prefill).
inline constexpr int64_t kLutMaxRows = 8;
// Queries per prefill work item.
inline constexpr int64_t kQueryBlock = 32;
// Widest group the cache stores (5..8 bits: low nibble + extension pages).
inline constexpr int kMaxWideBits = 8;

#ifdef RATEKV_PACKED_FAST
inline constexpr bool kHaveFast = true;
#else
inline constexpr bool kHaveFast = false;
#endif

// Column of natural-order position k (0..15) of a tile row read by the fast
// path's tile_row(): k = 4j + n takes nibble n of the 16-bit half of lane
// word j; by element_pos that is column 2j + n mod 2 + 8·⌊n/2⌋.
constexpr int nat_col(int k) { return 2 * (k >> 2) + (k & 1) + 8 * ((k >> 1) & 1); }

// The fp16 norm of token slot `slot` of a group whose norm array starts at
// page + norm_offset.
inline float norm_at(const uint8_t* page, size_t norm_offset, int slot) {
  uint16_t h;
  std::memcpy(&h, page + norm_offset + 2 * static_cast<size_t>(slot), 2);  // little endian (x86/arm64)
  return fp16_to_fp32(h);
}

// One group of one side of one KV head in one page, as the page kernels read it.
struct PageGroup {
  const uint8_t* page = nullptr;  // the page (code_offset / norm_offset count from here)
  size_t code_offset = 0, norm_offset = 0;
  int dim = 0, dim_pad = 0, bits = 0;
  const float* levels = nullptr;  // 2^bits Lloyd–Max levels
  const float* lv16 = nullptr;    // levels padded to 16 (fast path: bits ≤ 4)
};

// Partial softmax-attention states of R query rows: s (R) the online-softmax
// states (ratekv/model/attention_state.h), o_rot (R, Dv) in the value groups'
// rotated domains, o_plain (R, d) of the fp16 rows.
struct RowStates {
  int64_t R = 0;
  int Dv = 0, d = 0;
  SoftmaxState* s = nullptr;
  float *o_rot = nullptr, *o_plain = nullptr;
  // Empty states (m = −∞, l = 0, o = 0).
  void reset();
  // Raises row r's max to mx (≥ its m), rescaling its l and outputs.
  void rescale(int64_t r, float mx);
};

// One fp16 row (key kr, value vr, d floats) of token t into every row that
// sees t (lo[r] ≤ t < hi[r]); q_orig (R, d).
void attend_fp16_token(RowStates& st, const float* q_orig, const float* kr, const float* vr, int64_t t,
                       const int64_t* lo, const int64_t* hi, const AttnParams& p);

// Masked online softmax over nu page tokens (token index t_first + u):
// S (R, kPageTokens) raw scores in, probabilities p_{r,u} out (0 where masked);
// the states are rescaled and l accumulated.
void softmax_page(RowStates& st, float* S, int nu, int64_t t_first, const int64_t* lo, const int64_t* hi,
                  const AttnParams& p);

// ---- scalar path (packed_attention_scalar.cpp): codes unpacked first ---------------

// The per-step key table of one row and group: tab[i·2^b + j] = q_rot[i]·c[j].
void build_key_table(const float* q_rot, int dim, int bits, const float* levels, std::vector<float>& tab);

// Decode rows: S_r[u − u0] += n_u · Σ_i tab[i·2^b + codes[u][i]] for u in [u0, u1)
// (codes (·, dim_pad) row-major u8, nrm[u] the norms).
void lut_key_scores(const PageGroup& G, const uint8_t* codes, const float* nrm, const float* tab, int u0, int u1,
                    float* S_r);

// Prefill rows: the levels tile tile[i][u] = n_u·c[idx_{u,i}], then
// S[r][u] += Σ_i q_rot[r][i]·tile[i][u] (q_rot row stride qstride).
void tile_key_scores(const PageGroup& G, const uint8_t* codes, const float* nrm, const float* q_rot, int qstride,
                     int64_t R, int u0, int u1, float* tile, float* S);

// o[r][i] += Σ_u p[r][u] · n_u · c[idx_{u,i}] (o row stride ostride), from unpacked codes.
void scalar_value_accumulate(const PageGroup& G, const uint8_t* codes, const float* S, int64_t R, int u0, int u1,
                             float* tile, float* o, int ostride);

#ifdef RATEKV_PACKED_FAST
// ---- fast path (packed_attention_avx2.cpp): groups of ≤ 4 bits, decode rows ----------

// S[r][u − u0] += n_u · Σ_k qn[r][k] · c[code_k] over the group's channel
// tiles; qn (R, qstride): the rotated query in natural tile order. nw: scratch
// of dim_pad / 16 · 4 · 32 words.
void fast_key_scores(const PageGroup& G, const float* qn, size_t qstride, int64_t R, int u0, int u1, float* S,
                     uint32_t* nw);

// o[r][c] += Σ_u p[r][u] · n_u · c[idx_{u,c}] (o row stride ostride): the value
// tile is the key tile transposed. pwn: scratch (R, kPageTokens).
void fast_value_accumulate(const PageGroup& G, const float* S, int64_t R, int u0, int u1, float* pwn, uint32_t* nw,
                           float* o, int ostride);
#endif

}  // namespace ratekv::cache::detail
