// The packed cache's decode fast path (AVX2 + FMA; include/ratekv/cache/
// packed_kv_cache.h): per page and channel tile the b lane words of a group
// become nibble words, a 16×16 tile's row becomes 16 codes in natural order,
// and the codes index the codebook with two 8-lane permutes. Groups of ≤ 4
// bits, decode rows (≤ kLutMaxRows). Tested against the scalar path
// (packed_attention_scalar.cpp) in tests/cache.
#include "packed_attention_kernels.h"

#ifdef RATEKV_PACKED_FAST
#include <immintrin.h>

namespace ratekv::cache::detail {

using packed::kPageTokens;
using packed::kTileChannels;
using packed::kTileTokens;

namespace {

// Nibble words of token tiles [tt0, tt1) of channel tile ct of a b-bit code
// segment: nw[tt·32 + lane] has the code of fragment element e in nibble e
// (code_bit_pos(): one shift and mask per word; 3 bits, tile 3: bit 3 of the
// nibbles of words 0, 1, 2).
template <int B>
void nibble_words_b(const uint8_t* seg, int ct, int tt0, int tt1, uint32_t* nw) {
  uint32_t w[B][packed::kWarpLanes];
  std::memcpy(w, seg + static_cast<size_t>(ct) * B * packed::kLaneRowBytes, sizeof(w));
  for (int tt = tt0; tt < tt1; ++tt) {
    uint32_t* o = nw + tt * packed::kWarpLanes;
    for (int L = 0; L < packed::kWarpLanes; ++L) {
      if constexpr (B == 3) {
        o[L] = tt < 3 ? (w[tt][L] & 0x77777777u)
                      : (((w[0][L] >> 3) & 0x11111111u) | ((w[1][L] >> 2) & 0x22222222u) |
                         ((w[2][L] >> 1) & 0x44444444u));
      } else {
        constexpr uint32_t mask = B == 1 ? 0x11111111u : B == 2 ? 0x33333333u : 0xFFFFFFFFu;
        const int q = tt * B;
        o[L] = (w[q / 4][L] >> (q % 4)) & mask;
      }
    }
  }
}

void nibble_words(int bits, const uint8_t* seg, int ct, int tt0, int tt1, uint32_t* nw) {
  switch (bits) {
    case 1: return nibble_words_b<1>(seg, ct, tt0, tt1, nw);
    case 2: return nibble_words_b<2>(seg, ct, tt0, tt1, nw);
    case 3: return nibble_words_b<3>(seg, ct, tt0, tt1, nw);
    default: return nibble_words_b<4>(seg, ct, tt0, tt1, nw);
  }
}

// Row x (0..15) of a 16×16 tile as 16 nibbles in natural order: the 16-bit
// half ⌊x/8⌋ of the nibble words of lanes 4(x mod 8) .. 4(x mod 8) + 3
// (element_pos: keys row = token, values row = channel).
inline uint64_t tile_row(const uint32_t* nw, int x) {
  const uint32_t* p = nw + 4 * (x & 7);
  const int sh = 16 * (x >> 3);
  return static_cast<uint64_t>((p[0] >> sh) & 0xFFFFu) | (static_cast<uint64_t>((p[1] >> sh) & 0xFFFFu) << 16) |
         (static_cast<uint64_t>((p[2] >> sh) & 0xFFFFu) << 32) | (static_cast<uint64_t>((p[3] >> sh) & 0xFFFFu) << 48);
}

struct LevelRegs {
  __m256 lo, hi;
  bool two;  // 16 levels: blend lo/hi on bit 3 of the code
};

// The 16 codebook levels of a natural-order row: a = positions 0..7, b = 8..15.
inline void decode16(uint64_t x, const LevelRegs& t, __m256& a, __m256& b) {
  const __m128i v = _mm_cvtsi64_si128(static_cast<long long>(x));
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i bytes = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
  const __m256i i0 = _mm256_cvtepu8_epi32(bytes), i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
  a = _mm256_permutevar8x32_ps(t.lo, i0);
  b = _mm256_permutevar8x32_ps(t.lo, i1);
  if (t.two) {
    a = _mm256_blendv_ps(a, _mm256_permutevar8x32_ps(t.hi, i0), _mm256_castsi256_ps(_mm256_slli_epi32(i0, 28)));
    b = _mm256_blendv_ps(b, _mm256_permutevar8x32_ps(t.hi, i1), _mm256_castsi256_ps(_mm256_slli_epi32(i1, 28)));
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace

void fast_key_scores(const PageGroup& G, const float* qn, size_t qstride, int64_t R, int u0, int u1, float* S,
                     uint32_t* nw) {
  const uint8_t* page = G.page;
  const int n_ct = G.dim_pad / kTileChannels, tt0 = u0 / kTileTokens, tt1 = (u1 + kTileTokens - 1) / kTileTokens;
  for (int ct = 0; ct < n_ct; ++ct)
    nibble_words(G.bits, page + G.code_offset, ct, tt0, tt1, nw + ct * packed::kTilesPerPage * 32);
  const LevelRegs lv{_mm256_loadu_ps(G.lv16), _mm256_loadu_ps(G.lv16 + 8), G.bits == 4};
  __m256 acc[kLutMaxRows];
  for (int u = u0; u < u1; ++u) {
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint32_t* nwu = nw + (u / kTileTokens) * 32;
    for (int ct = 0; ct < n_ct; ++ct) {
      __m256 a, b;
      decode16(tile_row(nwu + ct * packed::kTilesPerPage * 32, u % kTileTokens), lv, a, b);
      for (int64_t r = 0; r < R; ++r) {
        const float* q = qn + r * qstride + ct * kTileChannels;
        acc[r] = _mm256_fmadd_ps(a, _mm256_loadu_ps(q), acc[r]);
        acc[r] = _mm256_fmadd_ps(b, _mm256_loadu_ps(q + 8), acc[r]);
      }
    }
    const float n = norm_at(page, G.norm_offset, u);
    for (int64_t r = 0; r < R; ++r) S[r * kPageTokens + (u - u0)] += n * hsum(acc[r]);
  }
}

void fast_value_accumulate(const PageGroup& G, const float* S, int64_t R, int u0, int u1, float* pwn, uint32_t* nw,
                           float* o, int ostride) {
  // The value tile is the key tile transposed: row x = channel, its 16
  // tokens in natural order. pwn[r][tt·16 + k] = p_t·n_t of token
  // tt·16 + nat_col(k) (0 outside [u0, u1)); o[r][c] += Σ levels·pwn.
  const uint8_t* page = G.page;
  const int n_ct = G.dim_pad / kTileChannels, tt0 = u0 / kTileTokens, tt1 = (u1 + kTileTokens - 1) / kTileTokens;
  for (int i = tt0 * kTileTokens; i < tt1 * kTileTokens; ++i) {
    const int u = (i & ~15) + nat_col(i & 15);
    const bool in = u >= u0 && u < u1;
    const float n = in ? norm_at(page, G.norm_offset, u) : 0.0f;
    for (int64_t r = 0; r < R; ++r) pwn[r * kPageTokens + i] = in ? S[r * kPageTokens + (u - u0)] * n : 0.0f;
  }
  for (int ct = 0; ct < n_ct; ++ct)
    nibble_words(G.bits, page + G.code_offset, ct, tt0, tt1, nw + ct * packed::kTilesPerPage * 32);
  const LevelRegs lv{_mm256_loadu_ps(G.lv16), _mm256_loadu_ps(G.lv16 + 8), G.bits == 4};
  __m256 acc[kLutMaxRows];
  for (int ct = 0; ct < n_ct; ++ct)
    for (int x = 0; x < kTileChannels && ct * kTileChannels + x < G.dim; ++x) {
      for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
      for (int tt = tt0; tt < tt1; ++tt) {
        __m256 a, b;
        decode16(tile_row(nw + (ct * packed::kTilesPerPage + tt) * 32, x), lv, a, b);
        for (int64_t r = 0; r < R; ++r) {
          const float* w = pwn + r * kPageTokens + tt * kTileTokens;
          acc[r] = _mm256_fmadd_ps(a, _mm256_loadu_ps(w), acc[r]);
          acc[r] = _mm256_fmadd_ps(b, _mm256_loadu_ps(w + 8), acc[r]);
        }
      }
      for (int64_t r = 0; r < R; ++r) o[r * ostride + ct * kTileChannels + x] += hsum(acc[r]);
    }
}

}  // namespace ratekv::cache::detail

#endif  // RATEKV_PACKED_FAST
