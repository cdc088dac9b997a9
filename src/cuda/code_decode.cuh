// Code -> fp16 decode of the packed format's lane words (docs/packed_format.md
// §4, format version 2) for the tensor-core decode kernels: byte permutes
// (prmt) from a codebook held in registers, no shared-memory lookups.
//
// code_nibbles(w, bits, tt) gathers the 8 codes a lane holds for token tile tt
// of one 16×16 tile into the nibbles of one word (nibble e = element e =
// 4h + 2kk + p, docs/packed_format.md); decode_fragments turns them into the
// four half2 registers of that tile: bf[h][kk] = elements (h, kk, p = 0, 1).
// Read as mma.m16n8k16 fragments these are b0/b1 of n-half h (the tile as B,
// 16 k × 16 n) or, as the A operand of the transposed product (tile 16 × 16,
// row = n index), {a0, a1, a2, a3} = {bf[0][0], bf[1][0], bf[0][1], bf[1][1]}.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace ratekv::cuda::detail {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

/// The codebook of one group as byte tables: lo[w] byte k = low byte of the
/// fp16 level 4w + k, hi[w] the high byte (levels ≥ 2^bits are 0).
struct Codebook {
  uint32_t lo[4], hi[4];
};

__device__ __forceinline__ void load_codebook(const uint32_t* __restrict__ t, int bits,
                                              Codebook& cb) {
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    cb.lo[w] = t[w];
    cb.hi[w] = t[4 + w];
  }
  if (bits == 4) {
#pragma unroll
    for (int w = 2; w < 4; ++w) {
      cb.lo[w] = t[w];
      cb.hi[w] = t[4 + w];
    }
  }
}

/// The 8 codes of token tile tt as a word whose nibble e is element e's code
/// (bits above `bits` zero), from the lane's `bits` words w (format v2,
/// packed::code_bit_pos).
template <int CB>
__device__ __forceinline__ uint32_t code_nibbles(const uint32_t (&w)[4], int bits, int tt) {
  const int b = CB ? CB : bits;
  switch (b) {
    case 1: return (w[0] >> tt) & 0x11111111u;
    case 2: return (w[tt >> 1] >> (2 * (tt & 1))) & 0x33333333u;
    case 3:
      if (tt < 3) return w[tt] & 0x77777777u;
      return ((w[0] >> 3) & 0x11111111u) | ((w[1] >> 2) & 0x22222222u) | ((w[2] >> 1) & 0x44444444u);
    default: return w[tt];
  }
}

/// The lookup selectors and code-bit-3 byte masks of eight 16-level (4-bit)
/// codes, nibbles 0..7 of s: lo / hi = code bits 0..2 of codes 0..3 / 4..7 as
/// prmt selectors (prmt reads a selector's low 16 bits), m_lo / m_hi = 0xFF in
/// byte k where code k / 4 + k has bit 3 set (sign-mode prmts over s << 4 and s:
/// bits 3, 7, 11, 15 of s for codes 0..3, bits 19, 23, 27, 31 for 4..7).
/// Five integer instructions per eight codes; shared by the fp16 decode below
/// and the int8 decode of the GQA ≤ 8 kernel (decode8_i8).
struct Select16 {
  uint32_t lo, hi, m_lo, m_hi;
};

__device__ __forceinline__ Select16 select16(uint32_t s) {
  const uint32_t s7 = s & 0x77777777u, s4 = s << 4;
  return {s7, s7 >> 16, prmt(s4, s, 0xD9C8u), prmt(s4, s, 0xFBEAu)};
}

/// Four codes -> the low and high bytes of their fp16 levels (byte k = code
/// k). Up to 8 levels: s = the codes (nibbles 0..3, bit 3 zero), m unused. 16
/// levels: s = their bits 0..2 and m the byte mask of bit 3 (select16): the
/// two 8-byte halves of the codebook looked up and picked per byte.
template <bool L16>
__device__ __forceinline__ void lookup_level_bytes(uint32_t s, uint32_t m, const Codebook& cb,
                                                   uint32_t& lo, uint32_t& hi) {
  if constexpr (!L16) {
    lo = prmt(cb.lo[0], cb.lo[1], s);
    hi = prmt(cb.hi[0], cb.hi[1], s);
  } else {
    lo = (prmt(cb.lo[0], cb.lo[1], s) & ~m) | (prmt(cb.lo[2], cb.lo[3], s) & m);
    hi = (prmt(cb.hi[0], cb.hi[1], s) & ~m) | (prmt(cb.hi[2], cb.hi[3], s) & m);
  }
}

/// B fragments (n-half h, register kk) of one 16×16 tile from its 8 codes
/// (nibbles of nib, code_nibbles); CB = the width at compile time, 0 = `bits`.
/// bf[h][0] / bf[h][1] = the half2 of elements 4h + {0, 1} / 4h + {2, 3}.
template <int CB>
__device__ __forceinline__ void decode_fragments(uint32_t nib, int bits, const Codebook& cb,
                                                 uint32_t (&bf)[2][2]) {
  uint32_t lo[2], hi[2];
  if ((CB ? CB : bits) < 4) {
    lookup_level_bytes<false>(nib, 0u, cb, lo[0], hi[0]);
    lookup_level_bytes<false>(nib >> 16, 0u, cb, lo[1], hi[1]);
  } else {
    const Select16 q = select16(nib);
    lookup_level_bytes<true>(q.lo, q.m_lo, cb, lo[0], hi[0]);
    lookup_level_bytes<true>(q.hi, q.m_hi, cb, lo[1], hi[1]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    bf[h][0] = prmt(lo[h], hi[h], 0x5140u);
    bf[h][1] = prmt(lo[h], hi[h], 0x7362u);
  }
}

/// 2^x with the SFU's approximate exp2 (flush-to-zero; 2^−∞ = 0), one
/// instruction instead of exp2f's range fix-ups.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ratekv::cuda::detail
