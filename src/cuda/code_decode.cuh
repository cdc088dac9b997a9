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

/// Four codes (nibbles 0..3 of s) -> two half2 fragment registers
/// (elements 0,1 and 2,3).
template <int CB>
__device__ __forceinline__ void nibbles_to_half2(uint32_t s, int bits, const Codebook& cb,
                                                 uint32_t& r0, uint32_t& r1) {
  uint32_t lo, hi;
  if ((CB ? CB : bits) < 4) {
    lo = prmt(cb.lo[0], cb.lo[1], s);
    hi = prmt(cb.hi[0], cb.hi[1], s);
  } else {
    // 16 levels: two 8-byte halves, chosen per byte by code bit 3 (sign-mode
    // prmt replicates bit 3 of nibble k into byte k of the mask).
    const uint32_t s7 = s & 0x7777u;
    const uint32_t m = prmt(s << 4, s, 0xD9C8u);
    const uint32_t la = prmt(cb.lo[0], cb.lo[1], s7), lb = prmt(cb.lo[2], cb.lo[3], s7);
    const uint32_t ha = prmt(cb.hi[0], cb.hi[1], s7), hb = prmt(cb.hi[2], cb.hi[3], s7);
    lo = (la & ~m) | (lb & m);
    hi = (ha & ~m) | (hb & m);
  }
  r0 = prmt(lo, hi, 0x5140u);
  r1 = prmt(lo, hi, 0x7362u);
}

/// B fragments (n-half h, register kk) of one 16×16 tile from its 8 codes.
template <int CB>
__device__ __forceinline__ void decode_fragments(uint32_t nib, int bits, const Codebook& cb,
                                                 uint32_t (&bf)[2][2]) {
  nibbles_to_half2<CB>(nib, bits, cb, bf[0][0], bf[0][1]);
  nibbles_to_half2<CB>(nib >> 16, bits, cb, bf[1][0], bf[1][1]);
}

/// 2^x with the SFU's approximate exp2 (flush-to-zero; 2^−∞ = 0), one
/// instruction instead of exp2f's range fix-ups.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ratekv::cuda::detail
