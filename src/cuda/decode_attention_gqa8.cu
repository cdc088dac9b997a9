// Fused split-K decode attention for GQA ≤ 8: the query rows of a KV head are
// the N = 8 side of the MMAs (docs/design.md §6, §8; docs/packed_format.md, format
// version 2). Instances per head_dim:
//  - uniform plans (one b-bit key and one b-bit value group per head, b = 1..4;
//    variant `specialized`): widths and offsets at compile time, integer key
//    scores and integer P·V products (below);
//  - general int8 (any other plan of 1..4-bit groups under `specialized`:
//    Block-GTQ, RateQuant, K≠V widths, 0-bit sides): the same integer products
//    per group — widths, int8 codebooks, offsets and norms per group from the
//    head tables in shared memory, the key groups' int32 sums each folded with
//    the group's norms (its codebook scale over the head's largest key scale
//    in its query tiles, the largest in the softmax exponent), the P·n^V split
//    per value group with that group's norms; a second instance when every
//    head has one value group over its head_dim channels (Block-GTQ and
//    RateQuant plans: the value tiles at compile time, the width through a
//    switch);
//  - general fp16 (every plan under `runtime_tables`): fp16 levels and query,
//    fp32 accumulation, one accumulator per key group folded with the group's
//    norms.
// GQA > 8 takes decode_attention_packed.cu, 5..8-bit groups
// decode_attention_generic.cu.
//
// Transposed orientation: the decoded codes are the A operand, so no
// tensor-core row is a padding row and one MMA consumes a whole code tile:
//   Sᵀ (16 tokens × 8 rows) += K (A) · Q̃ᵀ (B)
//        int8 (uniform; general int8 per key group): A = 16 tokens × 32 channels
//                 of int8 levels, B = the int8 hi and lo parts of the query;
//                 mma.m16n8k32.s8, int32 accumulation
//        general fp16: A = 16 tokens × 16 channels of fp16 levels, B = fp16 query;
//                 mma.m16n8k16, fp32 accumulation
//   Oᵀ (16 channels × 8 rows) += V_tileᵀ (A) · (P ∘ n^V_g)ᵀ (B)
//        int8: A = 16 channels × 32 tokens of int8 levels, B = the int8 hi and
//                 lo parts of x = P ∘ n^V_g · 127/(max_t p_t·max|n^V_g|) (per row,
//                 page and value group); m16n8k32.s8,
//                 int32 sums per page folded into fp32 O (split_int8)
//        general fp16: A = 16 channels × 16 tokens of fp16 levels, B = fp16 P ∘ n^V_g;
//                 mma.m16n8k16, fp32 accumulation
// The format's lane words hold exactly these A fragments (code_decode.cuh): a
// code becomes its int8 level with one byte permute per 4 codes (5.5
// instructions per 4 codes for 16 levels: decode8_i8)
// (ref::int8_levels: one scale per codebook), an fp16 level takes two per 2
// codes. The uniform score of token t, row r is
// n^K_t · s_r·s_L/254 · (254·Σ hi·L + Σ lo·L), the scale folded into the softmax
// exponent (general int8: Σ_g n^K_{g,t} · (254·Σ hi·L + Σ lo·L)_g, the
// group's hi / lo parts those of q̃_g·s_{L,g}/s_{L,max}, with s_r·s_{L,max}/254
// in the exponent); its output sV·pm·max|n^V|/127 · (Σ_t hi_t·L_t +
// Σ_t lo_t·L_t/254) per value group. A lane owns query rows 2t, 2t+1 (its softmax state) and tokens g,
// g+8 of each token tile; P moves from the C layout of Sᵀ to the B layout of
// the P·V product with movmatrix (one 8×8 transpose per half tile).
//
// Grid (⌈n_splits/W⌉, n_kv_heads, batch), W = 8 warps per CTA (4 for
// head_dim 256), one split per warp, each warp a contiguous range of 64-token
// pages of one sequence. A page's head block (codes + norms, contiguous)
// arrives by one bulk async copy (TMA, cp.async.bulk) into one of two stages
// per warp, completion signalled on an mbarrier; the next page is in flight
// while one is computed. The CTA then merges its warps' split states in shared
// memory (the log-sum-exp merge of splitk_lse_merge.cu): one state per CTA
// goes to the partials (so the merge launch reads W times fewer — at B = 1,
// T = 128K it read 264 (Llama-3.1-8B) / 1024 (Qwen2.5-3B) states per query
// row), or, when the CTA holds every split of its row, it rotates back and
// writes the output itself (no merge launch).
#include <algorithm>

#include "attention_common.cuh"
#include "code_decode.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda::detail {

namespace {

constexpr int kStages = 2;  // pages in flight per warp (current + prefetch)
// Splits (warps) per CTA: 8 (2 CTAs per SM); head_dim 256 stages twice the
// bytes per page and takes 4 so that two stages per warp fit in shared memory.
template <int D>
constexpr int kWarps = D > 128 ? 4 : 8;
static_assert(kPackedWarpsPerCta % kWarps<64> == 0 && kPackedWarpsPerCta % kWarps<256> == 0,
              "default_splits rounds to whole CTAs");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
/// Makes mbarrier initialisation visible to the async proxy (TMA).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/// Arrives once on `bar` and announces `bytes` of async-copy traffic.
__device__ __forceinline__ void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
/// Bulk async copy of `bytes` (multiple of 16, both addresses 16-byte aligned)
/// global -> shared, completion counted on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
/// Waits until the phase with parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
/// Transpose of an 8×8 b16 matrix held as one mma C/A-style fragment
/// (lane (g, t): row g, columns 2t, 2t+1) into the same fragment of the transpose.
__device__ __forceinline__ uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

/// mma.m16n8k32 with int8 A and B, int32 accumulation (fragment layout as
/// m16n8k16 with 4 int8 per register: a0 = (row g, k 4t..4t+3), a1 = (g+8, …),
/// a2 = (g, k 16+4t..), a3 = (g+8, 16+…); b0 = (k 4t..4t+3, n g), b1 = (k 16+4t.., n g)).
__device__ __forceinline__ void imma_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                           uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// imma_16832 into a fresh accumulator: d = A·B (no zeroing moves).
__device__ __forceinline__ void imma_16832_new(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0u));
}

/// Two fp16 pairs x0 = (row g: tokens 2t, 2t+1) and x1 = (tokens 2t+8, 2t+9),
/// −127.5 < x (clamped to ≤ 127 here), -> the int8 B fragments of the m16n8k32 P·V product, hi =
/// round(x) and lo = round(254·(x − hi)) (so x = hi + lo/254 ± 1/508), bytes in
/// the k order 2t, 2t+1, 2t+8, 2t+9 (the order code_nibbles gives the codes).
/// fp16 adds of 1536 = 1.5·2^10 round to an integer held in the low byte.
__device__ __forceinline__ void split_int8(uint32_t x0, uint32_t x1, uint32_t& hi, uint32_t& lo) {
  const __half2 mag = __halves2half2(__ushort_as_half(0x6600), __ushort_as_half(0x6600));
  const __half2 k254 = __halves2half2(__ushort_as_half(0x5BF0), __ushort_as_half(0x5BF0));
  const __half2 lim = __halves2half2(__ushort_as_half(0x57F0), __ushort_as_half(0x57F0));  // 127
  const __half2 a = __hmin2(*reinterpret_cast<const __half2*>(&x0), lim);
  const __half2 b = __hmin2(*reinterpret_cast<const __half2*>(&x1), lim);
  const __half2 ha = __hadd2(a, mag), hb = __hadd2(b, mag);
  const __half2 la = __hfma2(__hsub2(a, __hsub2(ha, mag)), k254, mag);
  const __half2 lb = __hfma2(__hsub2(b, __hsub2(hb, mag)), k254, mag);
  hi = prmt(*reinterpret_cast<const uint32_t*>(&ha), *reinterpret_cast<const uint32_t*>(&hb), 0x6420u);
  lo = prmt(*reinterpret_cast<const uint32_t*>(&la), *reinterpret_cast<const uint32_t*>(&lb), 0x6420u);
}

/// An int8 codebook in registers: byte k of c[w] = int8 level 4w + k.
struct Codebook8 {
  uint32_t c[4];
};

/// Eight codes (nibbles 0..7 of s; for B < 4 the bits above B are zero) ->
/// their int8 levels, codes 0..3 in the bytes of lo, 4..7 in hi. ≤ 8 levels:
/// one prmt per four codes. 16 levels: the two 8-byte halves of the codebook
/// looked up with code bits 0..2 and picked per byte by code bit 3
/// (code_decode.cuh's select16): 11 instructions per eight codes.
template <int B>
__device__ __forceinline__ void decode8_i8(uint32_t s, const Codebook8& cb, uint32_t& lo, uint32_t& hi) {
  if constexpr (B < 4) {
    lo = prmt(cb.c[0], cb.c[1], s);
    hi = prmt(cb.c[0], cb.c[1], s >> 16);
  } else {
    const Select16 q = select16(s);
    lo = (prmt(cb.c[0], cb.c[1], q.lo) & ~q.m_lo) | (prmt(cb.c[2], cb.c[3], q.lo) & q.m_lo);
    hi = (prmt(cb.c[0], cb.c[1], q.hi) & ~q.m_hi) | (prmt(cb.c[2], cb.c[3], q.hi) & q.m_hi);
  }
}

/// General instance, keys: Sg += (16 tokens × 16 channels codes of tiles
/// [0, n_tiles) of one B-bit group, starting at `codes`) · Q̃ᵀ per token tile;
/// qf = the group's first query fragment. Tile loop not unrolled (Sg is
/// indexed by token tile only).
template <int B>
__device__ __forceinline__ void key_group_tiles(float (&Sg)[4][4], const uint8_t* codes,
                                                const uint2* qf, int n_tiles, const Codebook& cb,
                                                int lane) {
#pragma unroll 1
  for (int k = 0; k < n_tiles; ++k) {
    const uint32_t* rows = reinterpret_cast<const uint32_t*>(codes + k * B * 128) + lane;
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = j < B ? rows[32 * j] : 0u;
    const uint2 q = qf[k * 32 + lane];
#pragma unroll
    for (int tt = 0; tt < 4; ++tt) {
      uint32_t f[2][2];
      decode_fragments<B>(code_nibbles<B>(w, B, tt), B, cb, f);
      const uint32_t a[4] = {f[0][0], f[1][0], f[0][1], f[1][1]};
      mma_16816(Sg[tt], a, q.x, q.y);
    }
  }
}

/// General instance, values: Oᵀ[vt] += V_tileᵀ · pb for the tiles vt ∈
/// [t0, t1) of one B-bit group whose codes start at `codes` (tile t0).
/// Unrolled over all NT tiles (O must be indexed by constants).
template <int B, int NT>
__device__ __forceinline__ void value_group_tiles(float (&O)[NT][4], const uint8_t* codes, int t0,
                                                  int t1, const uint32_t (&pb)[4][2],
                                                  const Codebook& cb, int lane) {
#pragma unroll
  for (int vt = 0; vt < NT; ++vt) {
    if (vt < t0 || vt >= t1) continue;
    const uint32_t* rows = reinterpret_cast<const uint32_t*>(codes + (vt - t0) * B * 128) + lane;
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = j < B ? rows[32 * j] : 0u;
#pragma unroll
    for (int tt = 0; tt < 4; ++tt) {
      uint32_t f[2][2];
      decode_fragments<B>(code_nibbles<B>(w, B, tt), B, cb, f);
      const uint32_t a[4] = {f[0][0], f[1][0], f[0][1], f[1][1]};
      mma_16816(O[vt], a, pb[tt][0], pb[tt][1]);
    }
  }
}

/// Int8 instances, keys: one k = 32 step over channel tiles k, k+1 into
/// (Sh, Sl): A = the int8 levels of those tiles' codes (tile k's B words per
/// lane at rows0[32·j], tile k+1's at rows0[32·(B + j)]; zero when !pair), b0
/// / b1 = tile k's / tile k+1's query part (hi into Sh, lo into Sl; a zero
/// part for an absent tile k+1). FIRST: the accumulators start at 0 (no
/// zeroing moves). The uniform instance calls it per k step with its uint4
/// query fragment, the general ones through key_pair_i8.
template <int B, bool FIRST>
__device__ __forceinline__ void key_step_i8(int (&Sh)[4][4], int (&Sl)[4][4], const uint32_t* rows0,
                                            bool pair, uint32_t qh0, uint32_t qh1, uint32_t ql0,
                                            uint32_t ql1, const Codebook8& cb) {
  const uint32_t* rows1 = rows0 + B * 32;
  uint32_t w0[4], w1[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w0[j] = j < B ? rows0[32 * j] : 0u;
    w1[j] = j < B && pair ? rows1[32 * j] : 0u;
  }
#pragma unroll
  for (int tt = 0; tt < 4; ++tt) {
    const uint32_t na = code_nibbles<B>(w0, B, tt), nb = code_nibbles<B>(w1, B, tt);
    uint32_t a[4];
    decode8_i8<B>(na, cb, a[0], a[1]);
    decode8_i8<B>(nb, cb, a[2], a[3]);
    if constexpr (FIRST) {
      imma_16832_new(Sh[tt], a, qh0, qh1);
      imma_16832_new(Sl[tt], a, ql0, ql1);
    } else {
      imma_16832(Sh[tt], a, qh0, qh1);
      imma_16832(Sl[tt], a, ql0, ql1);
    }
  }
}

/// General int8 instances, keys: one k = 32 step of key_group_tiles_i8 —
/// tiles k, k+1 (pair = k+1 < n_tiles; else a zero query part) of the group
/// whose codes start at `codes`, query fragments qf (x = hi, y = lo per tile).
template <int B, bool FIRST>
__device__ __forceinline__ void key_pair_i8(int (&Sh)[4][4], int (&Sl)[4][4], const uint8_t* codes,
                                            const uint2* qf, int k, bool pair, const Codebook8& cb,
                                            int lane) {
  const uint2 qa = qf[k * 32 + lane];
  const uint2 qb = pair ? qf[(k + 1) * 32 + lane] : make_uint2(0u, 0u);
  key_step_i8<B, FIRST>(Sh, Sl, reinterpret_cast<const uint32_t*>(codes + k * B * 128) + lane, pair, qa.x,
                        qb.x, qa.y, qb.y, cb);
}

/// General int8 instances, keys: (Sh, Sl) = (16 tokens × 32 channels of int8
/// levels) · (the int8 hi / lo parts of Q̃ᵀ) over the tiles [0, n_tiles)
/// (n_tiles ≥ 1) of one B-bit group starting at `codes`, two tiles per
/// mma.m16n8k32 (an odd last tile pairs with a zero query part); qf = the
/// group's first tile of query fragments (x = hi, y = lo; the layout of the
/// uniform instance's b0 / b1 per tile). Tile loop not unrolled.
template <int B>
__device__ __forceinline__ void key_group_tiles_i8(int (&Sh)[4][4], int (&Sl)[4][4],
                                                   const uint8_t* codes, const uint2* qf, int n_tiles,
                                                   const Codebook8& cb, int lane) {
  key_pair_i8<B, true>(Sh, Sl, codes, qf, 0, n_tiles > 1, cb, lane);
#pragma unroll 1
  for (int k = 2; k < n_tiles; k += 2) key_pair_i8<B, false>(Sh, Sl, codes, qf, k, k + 1 < n_tiles, cb, lane);
}

/// Int8 instances, values: Oᵀ[vt] += c_r · (254·(V_tileᵀ · bh) + V_tileᵀ · bl)
/// for the tiles vt ∈ [t0, t1) of one B-bit group whose codes start at `codes`
/// (tile t0): A = 16 channels × 32 tokens (two token tiles) of int8 levels per
/// mma.m16n8k32, bh / bl the int8 hi / lo B fragments of x per token tile (row
/// g; tokens 2t, 2t+1, 2t+8, 2t+9), c[r] the fold of row 2t + r. Unrolled over
/// all NT tiles (O must be indexed by constants).
template <int B, int NT>
__device__ __forceinline__ void value_group_tiles_i8(float (&O)[NT][4], const uint8_t* codes, int t0,
                                                     int t1, const uint32_t (&bh)[4],
                                                     const uint32_t (&bl)[4], const float (&c)[2],
                                                     const Codebook8& cb, int lane) {
  const uint32_t* vrows = reinterpret_cast<const uint32_t*>(codes) + lane;
#pragma unroll
  for (int vt = 0; vt < NT; ++vt) {
    if (vt < t0 || vt >= t1) continue;
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = k < B ? vrows[((vt - t0) * B + k) * 32] : 0u;
    int ah[4], al[4];
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // token tiles 2u, 2u+1
      const uint32_t na = code_nibbles<B>(w, B, 2 * u), nb = code_nibbles<B>(w, B, 2 * u + 1);
      uint32_t a[4];
      decode8_i8<B>(na, cb, a[0], a[1]);
      decode8_i8<B>(nb, cb, a[2], a[3]);
      if (u == 0) {
        imma_16832_new(ah, a, bh[0], bh[1]);
        imma_16832_new(al, a, bl[0], bl[1]);
      } else {
        imma_16832(ah, a, bh[2], bh[3]);
        imma_16832(al, a, bl[2], bl[3]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)  // |254·Σhi·L + Σlo·L| ≤ 255·64·127² < 2^31
      O[vt][i] = fmaf((float)(ah[i] * 254 + al[i]), c[i & 1], O[vt][i]);
  }
}

/// Shared memory of a CTA: the warps' mbarriers, [general: the head tables],
/// the rotated query as B fragments, then each warp's kStages page stages.
/// Query fragments: uniform [D/32][32] uint4 (b0, b1 of the int8 hi part, then
/// of the lo part; lane (g, t): b0 = row g's channels 2t, 2t+1, 2t+8, 2t+9 of
/// tile 2j, b1 the same of tile 2j+1); general [tiles][32] uint2 (fp16 b0 =
/// channels 2t, 2t+1 and b1 = 2t+8, 2t+9 of row g; general int8: x = the int8
/// hi part, y = the lo part of q̃·ρ_g, ρ_g = s_L,g / s_L,max of the tile's key
/// group g, each as one tile's b0 of the uniform layout).
constexpr size_t kBarBytes = 128;  // ≥ 8 warps × kStages mbarriers, keeps what follows aligned
static_assert(kBarBytes >= 8 * kStages * sizeof(uint64_t));
constexpr size_t kTablesBytes = (sizeof(HeadTables) + 127) / 128 * 128;
/// Rotated 16-channel key tiles: D/16 (uniform), up to max_tiles_for(D) (general: padded groups).
template <int D, int UB>
constexpr int kKeyTiles = UB > 0 ? D / 16 : max_tiles_for(D);
/// Rotated 16-channel value tiles (the accumulator O): D/16 (uniform, and
/// kGeneralInt8FullValue: one value group over the head), up to
/// max_tiles_for(D) (general: padded groups).
template <int D, int UB>
constexpr int kTiles = UB > 0 || UB == kGeneralInt8FullValue ? D / 16 : max_tiles_for(D);
template <int D, int UB>
constexpr size_t kQfragBytes = UB > 0 ? (size_t)(D / 32) * 32 * sizeof(uint4)
                                      : (size_t)kKeyTiles<D, UB> * 32 * sizeof(uint2);
template <int D, int UB>
constexpr size_t kStagesOffset = kBarBytes + (UB > 0 ? 0 : kTablesBytes) + kQfragBytes<D, UB>;

/// The CTA merge (every launch): after the page loop, the stage buffers hold
/// each warp's split state, Os [W][8 rows][NT·16 channels], then m and l
/// [W][8] each; with fused_out also the merged rotated row orot [8][NT·16],
/// and the back-rotation reuses Os as its partial sums [W][8][D]. Floats,
/// from kStagesOffset.
template <int D, int UB>
constexpr size_t kFusedFloats = (size_t)kWarps<D> * 8 * kTiles<D, UB> * 16 + 2 * kWarps<D> * 8 +
                                (size_t)8 * kTiles<D, UB> * 16;

/// D: head_dim; UB: gqa8_instance (head_tables.h) — the plan's width (bits of
/// every key and value code) for a uniform plan; kGeneralInt8 (any value
/// side) / kGeneralInt8FullValue (one value group over every head's D
/// channels: Block-GTQ and RateQuant plans; value tiles at compile time, the
/// width through a switch) for the general int8 instances; kGeneralFp16 (0)
/// for the general fp16 instance (PackedDecodeVariant::runtime_tables).
/// Every CTA merges its warps' split states (warp w: split blockIdx.x·W + w of
/// part.n_splits). fused_out null: the CTA's merged state goes to `part` as
/// state blockIdx.x of gridDim.x per row (row stride gridDim.x, not
/// part.n_splits), merged by launch_splitk_lse_merge with n_splits = gridDim.x;
/// else the launch has one CTA per (sequence, KV head) (n_splits ≤ kWarps<D>)
/// and the CTA rotates back into fused_out (batch·n_heads, D) fp32 itself, as
/// splitk_lse_merge_kernel does (value Π_g and channels from rot / chans, read
/// from L2 into registers).
template <int D, int UB>
__global__ void __launch_bounds__(32 * kWarps<D>, 2) gqa8_decode_kernel(
    const HeadTables* __restrict__ tables, const uint8_t* __restrict__ pool, size_t page_bytes,
    const int32_t* __restrict__ page_table, int max_pages, const int32_t* __restrict__ seq_lens, int window,
    int pages_per_split, int n_heads, int gqa, const __half* __restrict__ qrot, Partials part,
    const float* __restrict__ rot, const int32_t* __restrict__ chans, float* __restrict__ fused_out) {
  constexpr bool U = UB > 0;
  constexpr bool FV = UB == kGeneralInt8FullValue;  // general keys, one full value group
  constexpr bool G8 = UB == kGeneralInt8 || FV;
  constexpr bool I8 = U || G8;  // int8 levels, two-part int8 query and P·n^V
  constexpr int NT = kTiles<D, UB>, NTK = kKeyTiles<D, UB>;
  static_assert(NT * 16 >= D, "the fused merge's Os region holds its back-rotation partial sums");
  constexpr int kSideCodeBytes = (D / 16) * UB * 128;  // uniform: one side's codes in the head block
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  HeadTables& Ts = *reinterpret_cast<HeadTables*>(smem + kBarBytes);  // general only
  uint8_t* qfrag_bytes = smem + kBarBytes + (U ? 0 : kTablesBytes);
  const int h = blockIdx.y, b = blockIdx.z;
  const int row_base = b * n_heads + h * gqa;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x * kWarps<D> + warp;
  const HeadTables& Tg = tables[h];  // global (read before the shared copy exists)
  const int stage_bytes = Tg.stage_bytes;
  uint8_t* stages = smem + kStagesOffset<D, UB> + (size_t)warp * kStages * stage_bytes;
  uint64_t* bar = bars + warp * kStages;
  const int len = seq_lens[b];
  const int n_pages_seq = (len + packed::kPageTokens - 1) / packed::kPageTokens;
  // Sliding window (DecodeBatch::window): tokens from `first` on; the split
  // partition starts at the page holding it.
  const int first = window > 0 ? max(0, len - window) : 0;
  const int page_lo = first / packed::kPageTokens + split * pages_per_split;
  const int page_hi = split < part.n_splits ? min(page_lo + pages_per_split, n_pages_seq) : page_lo;
  const int32_t* pt = page_table + (size_t)b * max_pages;
  const uint8_t* head_base = pool + Tg.block_offset;
  auto issue = [&](int page, int stage) {
    if (lane == 0) {
      mbarrier_expect_tx(&bar[stage], (uint32_t)stage_bytes);
      bulk_copy_g2s(stages + stage * stage_bytes, head_base + (size_t)pt[page] * page_bytes,
                    (uint32_t)stage_bytes, &bar[stage]);
    }
  };
  // The warp's first page goes out before the CTA-wide prologue.
  if (lane == 0) {
    mbarrier_init(&bar[0], 1);
    mbarrier_init(&bar[1], 1);
    fence_mbarrier_init();
  }
  __syncwarp();
  if (page_lo < page_hi) issue(page_lo, 0);
  if constexpr (!U) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(tables + h);
    uint32_t* dst = reinterpret_cast<uint32_t*>(&Ts);
    for (int i = threadIdx.x; i < (int)(sizeof(HeadTables) / 4); i += blockDim.x) dst[i] = src[i];
  }
  // Rotated query: written by the rotation kernel, which this launch may overlap (PDL).
  grid_dependency_wait();
  __shared__ float q_scale[8];
  if constexpr (I8) {
    // Two-part int8 B fragments: per row r, s_r = max|q̃_r|/127 (1 for a zero
    // row, e.g. rows ≥ gqa), q̃/s_r = hi + lo/254 with hi = round(q̃/s_r) and
    // lo = round((q̃/s_r − hi)·254), both in [−127, 127]. A row with a NaN or
    // infinite element gets s_r = NaN, so its output is NaN (as in the fp16
    // kernels) instead of a finite number from the integer conversion. The
    // rotated row's written columns: D (uniform), n_tiles[0]·16 (general).
    const int n_cols = U ? D : Tg.n_tiles[0] * 16;
    for (int r = warp; r < 8; r += kWarps<D>) {
      float mx = 0.f;
      bool finite = true;
      if (r < gqa)
        for (int c = lane; c < n_cols; c += 32) {
          const float v = __half2float(qrot[(size_t)(row_base + r) * kMaxTiles * 16 + c]);
          finite = finite && isfinite(v);
          mx = fmaxf(mx, fabsf(v));
        }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      finite = __all_sync(0xffffffffu, finite);
      if (lane == 0) q_scale[r] = !finite ? NAN : mx > 0.f ? mx / 127.f : 1.f;
    }
    __syncthreads();
    // The hi / lo bytes of channels 2qt + (e & 1) + 8·(e >> 1), e = 0..3, of
    // one tile of row r (the k order 4qt + e of an m16n8k32 B fragment).
    auto split_tile = [&](const __half* r, float inv, int qt, uint32_t& hi, uint32_t& lo) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = __half2float(r[2 * qt + (e & 1) + 8 * (e >> 1)]) * inv;  // |x| ≤ 127
        const float xh = rintf(x);
        const int ih = (int)xh, il = (int)rintf((x - xh) * 254.f);
        hi |= (uint32_t)(ih & 0xff) << (8 * e);
        lo |= (uint32_t)(il & 0xff) << (8 * e);
      }
    };
    if constexpr (U) {
      uint4* qfrag = reinterpret_cast<uint4*>(qfrag_bytes);
      for (int i = threadIdx.x; i < D / 32 * 32; i += blockDim.x) {
        const int j = i >> 5, ln = i & 31, qg = ln >> 2, qt = ln & 3;
        uint32_t hi[2] = {0u, 0u}, lo[2] = {0u, 0u};
        if (qg < gqa) {
          const float inv = 1.f / q_scale[qg];
          const __half* r = qrot + (size_t)(row_base + qg) * kMaxTiles * 16;
#pragma unroll
          for (int u = 0; u < 2; ++u) split_tile(r + (2 * j + u) * 16, inv, qt, hi[u], lo[u]);
        }
        qfrag[i] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
      }
    } else {
      // One uint2 (hi, lo) per tile and lane; rows ≥ gqa and tiles ≥ n_tiles[0]
      // zero. Tile kt of key group g carries q̃·s_L,g / s_L,max (s_L the int8
      // codebook scales, s_L,max = HeadTables::i8kmax), so the group's fold needs
      // no product by its s_L (the largest-scale group keeps the whole 2-part
      // precision; a group of scale ratio ρ ≤ 1 loses log2(1/ρ) bits of ≈ 15).
      // From the shared copy of the tables (complete: the barrier above).
      uint2* qfrag = reinterpret_cast<uint2*>(qfrag_bytes);
      const int nK = Tg.n_tiles[0];
      const float inv_smax = 1.f / Ts.i8kmax;
      for (int i = threadIdx.x; i < NTK * 32; i += blockDim.x) {
        const int kt = i >> 5, ln = i & 31, qg = ln >> 2, qt = ln & 3;
        uint32_t hi = 0u, lo = 0u;
        if (qg < gqa && kt < nK)
          split_tile(qrot + (size_t)(row_base + qg) * kMaxTiles * 16 + kt * 16,
                     Ts.i8scale[0][Ts.tile_group[0][kt]] * inv_smax / q_scale[qg],
                     qt, hi, lo);
        qfrag[i] = make_uint2(hi, lo);
      }
    }
  } else {
    // fp16 B fragments (rows ≥ gqa and tiles ≥ n_tiles[0] zero).
    uint2* qfrag = reinterpret_cast<uint2*>(qfrag_bytes);
    const int nK = Tg.n_tiles[0];
    for (int i = threadIdx.x; i < NTK * 32; i += blockDim.x) {
      const int kt = i >> 5, ln = i & 31, qg = ln >> 2, qt = ln & 3;
      const __half* r = qrot + (size_t)(row_base + qg) * kMaxTiles * 16 + kt * 16 + 2 * qt;
      const bool ok = qg < gqa && kt < nK;
      qfrag[i] = make_uint2(ok ? *reinterpret_cast<const uint32_t*>(r) : 0u,
                            ok ? *reinterpret_cast<const uint32_t*>(r + 8) : 0u);
    }
  }
  Codebook8 cbK8, cbV8;
  Codebook cbK, cbV;
  if constexpr (U) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      cbK8.c[w] = Tg.i8tab[0][0][w];
      cbV8.c[w] = Tg.i8tab[1][0][w];
    }
  }
  __syncthreads();
  const HeadTables& T = U ? Tg : Ts;
  const int nV = U || FV ? NT : T.n_tiles[1];
  // Softmax exponent per score unit, rows 2t, 2t+1: log2 e (general fp16);
  // uniform: log2 e · s_r · s_L / 254 per integer score unit; general int8:
  // log2 e · s_r · s_L,max / 254 (each key group's s_L,g / s_L,max is in its
  // query tiles).
  float kexp[2] = {kLog2e, kLog2e};
  float vscale8 = 0.f;  // uniform: the int8 value codebook's scale
  if constexpr (I8) {
    const float sl = (U ? Tg.i8scale[0][0] : Ts.i8kmax) / 254.f * kLog2e;
    if constexpr (U) vscale8 = Tg.i8scale[1][0];
    kexp[0] = q_scale[2 * t] * sl;
    kexp[1] = q_scale[2 * t + 1] * sl;
  }
  const bool fused = fused_out != nullptr;  // CTA-uniform
  // A warp without pages (split ≥ part.n_splits, or past its sequence's end)
  // keeps the empty state (m = −∞, l = 0, O = 0) and stays for the CTA's
  // barriers (the CTA merge below).

  float O[NT][4];  // Oᵀ: (channel 16vt + g (+8 for [2], [3]), row 2t + (i & 1))
#pragma unroll
  for (int vt = 0; vt < NT; ++vt)
#pragma unroll
    for (int i = 0; i < 4; ++i) O[vt][i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units), rows 2t, 2t+1
  float l[2] = {0.f, 0.f};              // this lane's partial row sums

  for (int pg = page_lo; pg < page_hi; ++pg) {
    const int k = pg - page_lo, stage = k & 1;
    if (pg + 1 < page_hi) issue(pg + 1, stage ^ 1);
    mbarrier_wait(&bar[stage], (uint32_t)(k >> 1) & 1u);
    const uint8_t* sb = stages + stage * stage_bytes;
    const int valid = len - pg * packed::kPageTokens;  // tokens of this page in use (may be > 64)

    // ---- Sᵀ per token tile; S[tt]: (token 16tt + g (+8 for [2], [3]), row 2t + (i & 1))
    float S[4][4];
    if constexpr (U) {
      // int32 (hi and lo query parts, S = 254·hi + lo; |S| < 2^31 for D ≤ 256).
      // Channel tiles 2j, 2j+1 make one k = 32 step: A = their codes of token g
      // (g+8), 4 per register, in the order of code_nibbles.
      int Sh[4][4], Sl[4][4];  // written by the first k step
      const uint4* qfrag = reinterpret_cast<const uint4*>(qfrag_bytes);  // (hi, hi, lo, lo) of tiles 2j, 2j+1
#pragma unroll
      for (int j = 0; j < D / 32; ++j) {
        const uint32_t* rows0 = reinterpret_cast<const uint32_t*>(sb + 2 * j * UB * 128) + lane;
        const uint4 q = qfrag[j * 32 + lane];
        if (j == 0) key_step_i8<UB, true>(Sh, Sl, rows0, true, q.x, q.y, q.z, q.w, cbK8);
        else key_step_i8<UB, false>(Sh, Sl, rows0, true, q.x, q.y, q.z, q.w, cbK8);
      }
      // Key norms (one group: S = n^K ∘ (Q̃·Cᵀ)).
      const __half* nk = reinterpret_cast<const __half*>(sb + T.norm_offset[0][0]);
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        const float n0 = __half2float(nk[16 * tt + g]), n1 = __half2float(nk[16 * tt + g + 8]);
#pragma unroll
        for (int i = 0; i < 4; ++i) S[tt][i] = (float)(Sh[tt][i] * 254 + Sl[tt][i]) * (i < 2 ? n0 : n1);
      }
    } else {
      // Per key group (widths at compile time through a switch): general int8
      // — int32 (Sh, Sl) over the group's tiles, folded as
      // S += n^K_g ∘ (254·Sh + Sl) (|·| < 2^31 as above; s_L,g / s_L,max is in
      // the group's query tiles, s_L,max in kexp); general fp16 —
      // an accumulator Sg, folded as S += n^K_g ∘ Sg (S = Σ_g n^K_g ∘ (Q̃_g · C_gᵀ)).
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) S[tt][i] = 0.f;
      const uint2* qfrag = reinterpret_cast<const uint2*>(qfrag_bytes);
      const int n_groups = T.n_groups[0];
#pragma unroll 1
      for (int grp = 0; grp < n_groups; ++grp) {
        const int bits = T.bits[0][grp], t0 = T.tile_begin[0][grp];
        const int n_tiles = T.dim_pad[0][grp] >> 4;
        const uint8_t* codes = sb + T.code_offset[0][grp];
        const uint2* qf = qfrag + t0 * 32;
        auto key_norm = [&](int token) {  // n^K_g of token `token` of the page
          return __half2float(reinterpret_cast<const __half*>(sb + T.norm_offset[0][grp])[token]);
        };
        if constexpr (G8) {
          Codebook8 cb;
#pragma unroll
          for (int w = 0; w < 4; ++w) cb.c[w] = T.i8tab[0][grp][w];
          int Sh[4][4], Sl[4][4];  // written by the group's first k step
          switch (bits) {
            case 1: key_group_tiles_i8<1>(Sh, Sl, codes, qf, n_tiles, cb, lane); break;
            case 2: key_group_tiles_i8<2>(Sh, Sl, codes, qf, n_tiles, cb, lane); break;
            case 3: key_group_tiles_i8<3>(Sh, Sl, codes, qf, n_tiles, cb, lane); break;
            default: key_group_tiles_i8<4>(Sh, Sl, codes, qf, n_tiles, cb, lane); break;
          }
#pragma unroll
          for (int tt = 0; tt < 4; ++tt) {
            const float n0 = key_norm(16 * tt + g), n1 = key_norm(16 * tt + g + 8);
#pragma unroll
            for (int i = 0; i < 4; ++i)
              S[tt][i] = fmaf((float)(Sh[tt][i] * 254 + Sl[tt][i]), i < 2 ? n0 : n1, S[tt][i]);
          }
        } else {
          load_codebook(T.ptab[0][grp], bits, cbK);
          float Sg[4][4];
#pragma unroll
          for (int tt = 0; tt < 4; ++tt)
#pragma unroll
            for (int i = 0; i < 4; ++i) Sg[tt][i] = 0.f;
          switch (bits) {
            case 1: key_group_tiles<1>(Sg, codes, qf, n_tiles, cbK, lane); break;
            case 2: key_group_tiles<2>(Sg, codes, qf, n_tiles, cbK, lane); break;
            case 3: key_group_tiles<3>(Sg, codes, qf, n_tiles, cbK, lane); break;
            default: key_group_tiles<4>(Sg, codes, qf, n_tiles, cbK, lane); break;
          }
#pragma unroll
          for (int tt = 0; tt < 4; ++tt) {
            const float n0 = key_norm(16 * tt + g), n1 = key_norm(16 * tt + g + 8);
#pragma unroll
            for (int i = 0; i < 4; ++i) S[tt][i] = fmaf(i < 2 ? n0 : n1, Sg[tt][i], S[tt][i]);
          }
        }
      }
    }
    // Tokens past the sequence -> −∞.
    if (valid < packed::kPageTokens) {  // warp-uniform: only a sequence's last page
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (16 * tt + g + 8 * (i >> 1) >= valid) S[tt][i] = -INFINITY;
    }
    // Tokens before a sliding window -> −∞ (written tokens: finite norms).
    if (pg * packed::kPageTokens < first) {  // warp-uniform: only the page holding the window's first token
      const int before = first - pg * packed::kPageTokens;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (16 * tt + g + 8 * (i >> 1) < before) S[tt][i] = -INFINITY;
    }
    // ---- online softmax, rows 2t + r: this lane's 8 tokens, then over g
    float alpha[2], pmx[2];  // pmx: the page's max score·kexp per row (log2 units)
    bool m_moved = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) mx = fmaxf(mx, fmaxf(S[tt][r], S[tt][r + 2]));
      mx *= kexp[r];
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      pmx[r] = mx;
      const float m_new = fmaxf(m[r], mx);  // finite: every page has a valid token
      // (A NaN row's max never moves — fmaxf drops NaN — but its l is NaN, so
      // its output is NaN.)
      const bool moved = !(m_new == m[r]);
      m_moved = m_moved || moved;
      alpha[r] = moved ? fast_exp2(m[r] - m_new) : 1.f;
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int i = r; i < 4; i += 2) {
          const float p = fast_exp2(fmaf(S[tt][i], kexp[r], -m_new));
          S[tt][i] = p;
          sum += p;
        }
      l[r] = l[r] * alpha[r] + sum;
    }
    // Rescale O only when a row's max moved on this page (after the first
    // pages of a long split it rarely does; warp-uniform branch).
    if (__any_sync(0xffffffffu, m_moved)) {
#pragma unroll
      for (int vt = 0; vt < NT; ++vt) {
        O[vt][0] *= alpha[0];
        O[vt][1] *= alpha[1];
        O[vt][2] *= alpha[0];
        O[vt][3] *= alpha[1];
      }
    }
    // ---- Oᵀ += V_tileᵀ · (P ∘ n^V_g)ᵀ per value tile; (P ∘ n^V_g)ᵀ as B
    // fragments (tokens 2t, 2t+1 (+8), row g) via 8×8 transposes, per value group.
    // Value norms of group grp for this lane's tokens 16tt + g (vn[tt][0]) and
    // 16tt + g + 8 (vn[tt][1]); unwritten slots (may hold NaN) read as 0.
    auto value_norms = [&](int grp, float (&vn)[4][2]) {
      const __half* nv = reinterpret_cast<const __half*>(sb + T.norm_offset[1][grp]);
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        float v0 = __half2float(nv[16 * tt + g]), v1 = __half2float(nv[16 * tt + g + 8]);
        if (valid < packed::kPageTokens) {  // warp-uniform: only a sequence's last page
          if (16 * tt + g >= valid) v0 = 0.f;
          if (16 * tt + g + 8 >= valid) v1 = 0.f;
        }
        vn[tt][0] = v0;
        vn[tt][1] = v1;
      }
    };
    uint32_t pb[4][2];
    auto p_fragments = [&](int grp) {
      float vn[4][2];
      value_norms(grp, vn);
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        pb[tt][0] = transpose_8x8(pack_half2(S[tt][0] * vn[tt][0], S[tt][1] * vn[tt][0]));
        pb[tt][1] = transpose_8x8(pack_half2(S[tt][2] * vn[tt][1], S[tt][3] * vn[tt][1]));
      }
    };
    // Int8 instances: the B fragments of value group grp (its norms; vscale =
    // its int8 codebook's scale sV) for the P·V product, and the fold c_lo per
    // row. Per row r (2t, 2t+1 in this lane) and page: x = p·n^V ·
    // 127/(pm_r·max_t|n^V_t|), with pm_r = 2^(pmx_r − m_r) the page's largest
    // weight of the row and the max over the page's written tokens, so
    // |x| ≤ 127 and the page's largest terms keep fp16's relative precision
    // (a scale by the norms alone would leave small-weight rows a fixed
    // absolute step: a sink token 12 log2 units above the rest quantised
    // the rest to a few steps). x is rounded to fp16 (clamped to 127: p may
    // exceed pm_r by an ulp of the exponent), moved to B layout by 8×8
    // transposes and split into int8 hi + lo/254 (split_int8). A = the value
    // codes as int8 levels (ref::int8_levels, scale sV), 32 tokens (two
    // token tiles) per mma.m16n8k32; per channel tile and page two int32
    // sums, folded as Oᵀ += sV·pm_r·max|n^V|/(127·254) · (254·Σ hi·L + Σ lo·L).
    // A non-finite norm makes the page's norm max ∞: the fold then gives a
    // non-finite O, as the fp16 path would, instead of a finite number from
    // the integer sums. A row whose page weighs < 2^-96 of its running max
    // adds nothing (fp16 P·n^V flushed such terms to 0 too).
    auto int8_p_parts = [&](int grp, float vscale, uint32_t (&bh)[4], uint32_t (&bl)[4],
                            float (&c_lo)[2]) {
      float vn[4][2];
      value_norms(grp, vn);
      float vmax = 0.f, chk = 0.f;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        vmax = fmaxf(vmax, fmaxf(fabsf(vn[tt][0]), fabsf(vn[tt][1])));
        chk += vn[tt][0] + vn[tt][1];
      }
      if (!(chk - chk == 0.f)) vmax = INFINITY;  // a NaN or infinite norm
      vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 4));  // lanes of one g hold the same tokens
      vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 8));
      vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 16));
      const float inv = vmax > 0.f ? 127.f * __frcp_rn(vmax) : 0.f;  // ∞ -> 0
      float rs[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float dm = m[r] - pmx[r];  // ≥ 0; NaN for a NaN row
        const bool live = dm < 96.f;
        rs[r] = live ? fast_exp2(dm) * inv : 0.f;
        c_lo[r] = live ? vscale * vmax * fast_exp2(-dm) * (1.f / (127.f * 254.f)) : 0.f;
      }
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        const float v0 = vn[tt][0], v1 = vn[tt][1];
        split_int8(transpose_8x8(pack_half2(S[tt][0] * (v0 * rs[0]), S[tt][1] * (v0 * rs[1]))),
                   transpose_8x8(pack_half2(S[tt][2] * (v1 * rs[0]), S[tt][3] * (v1 * rs[1]))), bh[tt], bl[tt]);
      }
    };
    if constexpr (U) {
      uint32_t bh[4], bl[4];  // per token tile: int8 hi / lo of x (row g; tokens 2t, 2t+1, 2t+8, 2t+9)
      float c_lo[2];
      int8_p_parts(0, vscale8, bh, bl, c_lo);
      value_group_tiles_i8<UB, NT>(O, sb + kSideCodeBytes, 0, NT, bh, bl, c_lo, cbV8, lane);
    } else if constexpr (G8) {
      // Value group grp's int8 B fragments, then its tiles [t0, t1) (width at
      // compile time through a switch).
      auto value_group = [&](int grp, int t0, int t1) {
        Codebook8 cb;
#pragma unroll
        for (int w = 0; w < 4; ++w) cb.c[w] = T.i8tab[1][grp][w];
        uint32_t bh[4], bl[4];
        float c_lo[2];
        int8_p_parts(grp, T.i8scale[1][grp], bh, bl, c_lo);
        const uint8_t* codes = sb + T.code_offset[1][grp];
        switch (T.bits[1][grp]) {
          case 1: value_group_tiles_i8<1, NT>(O, codes, t0, t1, bh, bl, c_lo, cb, lane); break;
          case 2: value_group_tiles_i8<2, NT>(O, codes, t0, t1, bh, bl, c_lo, cb, lane); break;
          case 3: value_group_tiles_i8<3, NT>(O, codes, t0, t1, bh, bl, c_lo, cb, lane); break;
          default: value_group_tiles_i8<4, NT>(O, codes, t0, t1, bh, bl, c_lo, cb, lane); break;
        }
      };
      if constexpr (FV) {
        value_group(0, 0, NT);  // one group over the head's D channels: tiles 0..NT−1 at compile time
      } else {
        const int n_groups = T.n_groups[1];
#pragma unroll 1
        for (int grp = 0; grp < n_groups; ++grp)
          value_group(grp, T.tile_begin[1][grp], T.tile_begin[1][grp] + (T.dim_pad[1][grp] >> 4));
      }
    } else {
      // Per value group (widths at compile time through a switch): its P
      // fragments, then its tiles.
      const int n_groups = T.n_groups[1];
#pragma unroll 1
      for (int grp = 0; grp < n_groups; ++grp) {
        const int bits = T.bits[1][grp], t0 = T.tile_begin[1][grp];
        const int t1 = t0 + (T.dim_pad[1][grp] >> 4);
        load_codebook(T.ptab[1][grp], bits, cbV);
        p_fragments(grp);
        const uint8_t* codes = sb + T.code_offset[1][grp];
        switch (bits) {
          case 1: value_group_tiles<1>(O, codes, t0, t1, pb, cbV, lane); break;
          case 2: value_group_tiles<2>(O, codes, t0, t1, pb, cbV, lane); break;
          case 3: value_group_tiles<3>(O, codes, t0, t1, pb, cbV, lane); break;
          default: value_group_tiles<4>(O, codes, t0, t1, pb, cbV, lane); break;
        }
      }
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  // The merge may start its prologue (it waits for all CTAs). Not when fused:
  // the output is written after this point, and a later kernel launched with
  // PDL must not be let in before it.
  if (!fused) allow_dependent_launch();

  // ---- split state: rows 2t + r < gqa; l summed over the lanes of the row (g)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 4);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 8);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 16);
  }
  {
    // ---- in-kernel merge of the CTA's splits
    constexpr int W = kWarps<D>, RD = NT * 16;
    float* Os = reinterpret_cast<float*>(smem + kStagesOffset<D, UB>);  // [W][8][RD]; later red [W][8][D]
    float* ms = Os + (size_t)W * 8 * RD;                                // [W][8]
    float* ls = ms + W * 8;                                             // [W][8]
    float* orot = ls + W * 8;                                           // [8][RD]
    __syncthreads();  // every warp is done with its stages (no copy in flight)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 2 * t + r;
      if (row >= gqa) continue;
      if (g == 0) {
        ms[warp * 8 + row] = m[r];
        ls[warp * 8 + row] = l[r];
      }
      float* o = Os + ((size_t)warp * 8 + row) * RD;
#pragma unroll
      for (int vt = 0; vt < NT; ++vt) {
        if (vt >= nV) break;
        o[vt * 16 + g] = O[vt][r];
        o[vt * 16 + g + 8] = O[vt][r + 2];
      }
    }
    __syncthreads();
    // M = max_w m_w, weights 2^(m_w − M) (empty splits 0), L = Σ_w w_w l_w,
    // orot = Σ_w w_w O_w / L (the formulas of splitk_lse_merge_kernel).
    const int n_o = nV * 16;
    for (int e = threadIdx.x; e < gqa * n_o; e += blockDim.x) {
      const int r = e / n_o, c = e % n_o;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) M = fmaxf(M, ms[w * 8 + r]);
      float L = 0.f, acc = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float mw = ms[w * 8 + r];
        const float wt = mw == -INFINITY ? 0.f : exp2f(mw - M);
        L = fmaf(wt, ls[w * 8 + r], L);
        acc = fmaf(wt, Os[((size_t)w * 8 + r) * RD + c], acc);
      }
      if (!fused) {  // the CTA's state Σ w O (all warps empty: 0)
        part.o[((size_t)(row_base + r) * gridDim.x + blockIdx.x) * part.o_dim + c] = acc;
        continue;
      }
      orot[r * RD + c] = acc / L;
    }
    if (!fused) {
      // and its {M, L} (all warps empty: −∞, 0), one thread per row: written
      // also for a value side with no tiles (n_o = 0, the loop above empty).
      for (int r = threadIdx.x; r < gqa; r += blockDim.x) {
        float M = -INFINITY, L = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) M = fmaxf(M, ms[w * 8 + r]);
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const float mw = ms[w * 8 + r];
          L = fmaf(mw == -INFINITY ? 0.f : exp2f(mw - M), ls[w * 8 + r], L);
        }
        const size_t idx = (size_t)(row_base + r) * gridDim.x + blockIdx.x;
        part.m[idx] = M;
        part.l[idx] = L;
      }
      return;
    }
    float* out = fused_out + (size_t)row_base * D;  // rows r < gqa of this KV head, D channels each
    // Output channels in no value group are 0 (as the merge); written before
    // the covered ones (the barrier orders the two writes of a channel).
    int covered = 0;
    for (int grp = 0; grp < T.n_groups[1]; ++grp) covered += T.dim[1][grp];
    if (covered < D)
      for (int e = threadIdx.x; e < gqa * D; e += blockDim.x) out[e] = 0.f;
    __syncthreads();
    // Back-rotation per value group: out[r, ch_i] = Σ_j Π_g[j][i] orot[r][base + j].
    // Warp w sums rows j ∈ [dim·w/W, dim·(w+1)/W) of Π_g, lanes over i (coalesced
    // rows read from L2 straight into registers, every KV head row of the CTA
    // sharing each load); the W partial sums meet in shared memory.
    constexpr int CH = D / 32;  // 32-channel chunks of a group (dim ≤ D)
    float* red = Os;            // [W][8][D]
    for (int grp = 0; grp < T.n_groups[1]; ++grp) {
      const int dim = T.dim[1][grp], base = T.tile_begin[1][grp] * 16;
      const float* R = rot + T.rot_offset[1][grp];
      const int32_t* ch = chans + T.chan_offset[1][grp];
      const int j_lo = dim * warp / W, j_hi = dim * (warp + 1) / W;
      float acc[CH][8];
#pragma unroll
      for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int r = 0; r < 8; ++r) acc[c][r] = 0.f;
#pragma unroll 4
      for (int j = j_lo; j < j_hi; ++j) {
        float ov[8];
#pragma unroll
        for (int r = 0; r < 8; ++r) ov[r] = r < gqa ? orot[r * RD + base + j] : 0.f;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
          const int i = 32 * c + lane;
          if (32 * c >= dim) break;  // warp-uniform
          const float rv = i < dim ? __ldg(R + (size_t)j * dim + i) : 0.f;
#pragma unroll
          for (int r = 0; r < 8; ++r) acc[c][r] = fmaf(rv, ov[r], acc[c][r]);
        }
      }
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const int i = 32 * c + lane;
        if (i < dim)
#pragma unroll
          for (int r = 0; r < 8; ++r)
            if (r < gqa) red[((size_t)warp * 8 + r) * D + i] = acc[c][r];
      }
      __syncthreads();
      for (int e = threadIdx.x; e < gqa * dim; e += blockDim.x) {
        const int r = e / dim, i = e % dim;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) sum += red[((size_t)w * 8 + r) * D + i];
        out[(size_t)r * D + ch[i]] = sum;
      }
      __syncthreads();  // red free for the next group
    }
    return;
  }
}

template <int D, int UB>
void launch(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
            const WorkspaceView& w, int pages_per_split, float* fused_out, cudaStream_t stream) {
  const auto& dev = plan.device();
  size_t tail = (size_t)kWarps<D> * kStages * dev.max_stage_bytes;  // the page stages
  tail = std::max(tail, kFusedFloats<D, UB> * sizeof(float));  // the CTA merge reuses them
  const size_t smem = kStagesOffset<D, UB> + tail;
  static int smem_set[kMaxDevices] = {};  // one cache per instance
  set_smem_limit(reinterpret_cast<const void*>(gqa8_decode_kernel<D, UB>), smem, smem_set);
  const dim3 grid((w.part.n_splits + kWarps<D> - 1) / kWarps<D>, plan.layout().n_kv_heads(),
                  batch.batch);
  launch_pdl(gqa8_decode_kernel<D, UB>, grid, dim3(32 * kWarps<D>), smem, stream, dev.heads, pool,
             plan.layout().page_bytes(), batch.page_table, batch.max_pages, batch.seq_lens, batch.window,
             pages_per_split, plan.n_heads(), plan.gqa(), (const __half*)w.q, w.part,
             (const float*)dev.rotations, (const int32_t*)dev.channels, fused_out);
}

/// Instance choice for head_dim D: gqa8_instance's value.
template <int D>
void launch_width(int ub, const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                  const WorkspaceView& w, int pps, float* fused_out, cudaStream_t stream) {
  switch (ub) {
    case kGeneralInt8: return launch<D, kGeneralInt8>(plan, batch, pool, w, pps, fused_out, stream);
    case kGeneralInt8FullValue:
      return launch<D, kGeneralInt8FullValue>(plan, batch, pool, w, pps, fused_out, stream);
    case kGeneralFp16: return launch<D, kGeneralFp16>(plan, batch, pool, w, pps, fused_out, stream);
    case 1: return launch<D, 1>(plan, batch, pool, w, pps, fused_out, stream);
    case 2: return launch<D, 2>(plan, batch, pool, w, pps, fused_out, stream);
    case 3: return launch<D, 3>(plan, batch, pool, w, pps, fused_out, stream);
    case 4: return launch<D, 4>(plan, batch, pool, w, pps, fused_out, stream);
    default:
      throw_error(cat("GQA-8 decode attention: plan width ", ub, " has no instance (-2..4)"));
  }
}

}  // namespace

int gqa8_splits_per_cta(int head_dim) { return head_dim > 128 ? kWarps<256> : kWarps<128>; }

void launch_gqa8_decode(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                        const WorkspaceView& w, int pages_per_split, bool int8,
                        cudaStream_t stream, float* fused_out) {
  require(plan.gqa() <= 8, "GQA-8 decode attention: GQA ", plan.gqa(), " > 8");
  require(!fused_out || w.part.n_splits <= gqa8_splits_per_cta(plan.head_dim()),
          "GQA-8 decode attention: the in-kernel merge needs n_splits <= ",
          gqa8_splits_per_cta(plan.head_dim()), " (one CTA per sequence and KV head), got ", w.part.n_splits);
  require(!plan.device().has_wide, "GQA-8 decode attention: the plan has 5..8-bit groups");
  require(plan.device().max_stage_bytes % 16 == 0, "GQA-8 decode attention: head block of ",
          plan.device().max_stage_bytes, " bytes is not a multiple of 16 (bulk copy)");
  const int ub = gqa8_instance(plan, int8);
  switch (plan.head_dim()) {
    case 64: return launch_width<64>(ub, plan, batch, pool, w, pages_per_split, fused_out, stream);
    case 128: return launch_width<128>(ub, plan, batch, pool, w, pages_per_split, fused_out, stream);
    case 256: return launch_width<256>(ub, plan, batch, pool, w, pages_per_split, fused_out, stream);
    default:
      throw_error(cat("GQA-8 decode attention: head_dim ", plan.head_dim(),
                      " has no kernel (64, 128, 256)"));
  }
}

}  // namespace ratekv::cuda::detail
