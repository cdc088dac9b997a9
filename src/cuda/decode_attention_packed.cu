// Fused split-K decode attention over the packed KV cache (DESIGN.md §6, §8;
// docs/packed_format.md, format version 2).
//
// Grid (⌈n_splits/W⌉, n_kv_heads, batch), W = 8 (uniform plans) or 4 warps per
// CTA, one split per warp.
// A warp owns the GQA query rows of one KV head (M = 16, rows ≥ gqa are zero)
// and a contiguous range of pages (64 tokens each) of one sequence. Per page
// it stages the KV head's whole head block (codes + norms, contiguous) with
// 16-byte cp.async (double-buffered), then per 16-channel tile reads the b
// lane words that hold all 4 token tiles, turns each token tile's 8 codes
// into fp16 B fragments with byte permutes (prmt) from a codebook held in
// registers (no shared-memory lookups), runs Q·Kᵀ on tensor cores
// (mma.m16n8k16, the query A fragments shared by the CTA's warps), folds the
// key norms into the 64 scores, updates the online softmax once per page,
// folds the value norms into P and runs P·V per value tile, accumulating in
// the rotated domain. merge_kernel merges the split states and rotates back.
#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

using detail::HeadTables;

namespace {

constexpr int kStages = 2;  // pages in flight per warp (current + prefetch)
// Warps (splits) per CTA; they share the head tables and the query fragments.
// Uniform instances: 8 warps, ≤ 128 registers (2 CTAs = 16 warps per SM);
// the general instance needs more registers: 4 warps, 3 CTAs per SM.
// The general instance with only query rows < 8 (R8, GQA ≤ 8) holds half the
// accumulators of the 16-row one and fits 8 warps too.
template <int UB, bool R8>
constexpr int kWarps = UB > 0 || R8 ? 8 : 4;
static_assert(detail::kPackedWarpsPerCta % kWarps<0, false> == 0 &&
                  detail::kPackedWarpsPerCta % kWarps<2, true> == 0,
              "default_splits rounds to whole CTAs");

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

/// mma.m16n8k16 for warps whose query rows are all < 8 (GQA ≤ 8): accumulates
/// only c[0], c[1] (rows g); the rows g+8 come out of a zero accumulator and are
/// dropped, so they hold no registers and need no softmax or rescaling.
__device__ __forceinline__ void mma_16816_top(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  float d2, d3;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%10,%11};\n"
      : "+f"(c[0]), "+f"(c[1]), "=f"(d2), "=f"(d3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f), "f"(0.f));
}

/// 2^x with the SFU's approximate exp2 (flush-to-zero; 2^−∞ = 0), one
/// instruction instead of exp2f's range fix-ups.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Online-softmax update over the 64 scores of one page (4 token tiles of
/// C fragments); on return S holds p = exp(S − m_new), alpha the rescale.
/// R8: only rows g (GQA ≤ 8).
template <bool R8>
__device__ __forceinline__ void softmax_page(detail::RowState& st, float (&S)[4][2][4],
                                             float (&alpha)[2]) {
  alpha[1] = 1.f;
#pragma unroll
  for (int r = 0; r < (R8 ? 1 : 2); ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int tt = 0; tt < 4; ++tt)
#pragma unroll
      for (int h = 0; h < 2; ++h) mx = fmaxf(mx, fmaxf(S[tt][h][2 * r], S[tt][h][2 * r + 1]));
    mx *= detail::kLog2e;
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(st.m[r], mx);  // finite: every page has a valid token
    alpha[r] = fast_exp2(st.m[r] - m_new);
    st.m[r] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int tt = 0; tt < 4; ++tt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float p = fast_exp2(fmaf(S[tt][h][2 * r + i], detail::kLog2e, -m_new));
          S[tt][h][2 * r + i] = p;
          sum += p;
        }
    st.l[r] = st.l[r] * alpha[r] + sum;
  }
}

/// D: head_dim; UB > 0: uniform plan (one key and one value group over the
/// whole head, both UB bits) and GQA ≤ 8, widths and offsets known at compile time;
/// UB = 0: any plan, widths/codebooks/offsets read per channel tile from the
/// head tables in shared memory. R8: the warp's query rows are all < 8 (GQA ≤ 8;
/// always true for UB > 0): rows g+8 of the m16n8k16 tiles are not computed.
template <int D, int UB, bool R8>
__global__ void __launch_bounds__(32 * kWarps<UB, R8>, D > 128 ? 1 : (UB > 0 || R8) ? 2 : 3) packed_decode_kernel(
    const HeadTables* __restrict__ tables, const uint8_t* __restrict__ pool, size_t page_bytes,
    const int32_t* __restrict__ page_table, int max_pages, const int32_t* __restrict__ seq_lens,
    int pages_per_split, int n_heads, int gqa, const __half* __restrict__ qrot,
    detail::Partials part) {
  constexpr bool U = UB > 0;
  static_assert(!U || R8, "uniform instances hold query rows < 8 only (GQA > 8 takes UB = 0)");
  constexpr int NT = U ? D / 16 : detail::max_tiles_for(D);  // rotated tiles per side (max)
  extern __shared__ __align__(16) uint8_t smem[];
  HeadTables& T = *reinterpret_cast<HeadTables*>(smem);
  constexpr int kTablesBytes = (sizeof(HeadTables) + 15) / 16 * 16;
  uint4* qfrag = reinterpret_cast<uint4*>(smem + kTablesBytes);  // [NT][32] A fragments
  const int h = blockIdx.y, b = blockIdx.z;
  const int row_base = b * n_heads + h * gqa;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
  const int split = blockIdx.x * kWarps<UB, R8> + warp;
  // Start this warp's first page before the CTA-wide prologue (its offsets read
  // straight from the global head table), so the page table lookup and the
  // page's copy overlap the table copy and the query fragments.
  const int stage_bytes = tables[h].stage_bytes;
  uint8_t* stages = smem + kTablesBytes + NT * 32 * 16 + (size_t)warp * kStages * stage_bytes;
  const int len = seq_lens[b];
  const int n_pages_seq = (len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int page_lo = split * pages_per_split;
  const int page_hi = split < part.n_splits ? min(page_lo + pages_per_split, n_pages_seq) : page_lo;
  const int32_t* pt = page_table + (size_t)b * max_pages;
  const uint8_t* head_base = pool + tables[h].block_offset;
  auto issue = [&](int page, int stage) {
    const uint8_t* src = head_base + (size_t)pt[page] * page_bytes;
    uint8_t* dst = stages + stage * stage_bytes;
    for (int u = lane * 16; u < stage_bytes; u += 32 * 16) detail::cp_async16(dst + u, src + u);
  };
  if (page_lo < page_hi) issue(page_lo, 0);
  detail::cp_async_commit();
  {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(tables + h);
    uint32_t* dst = reinterpret_cast<uint32_t*>(smem);
    for (int i = threadIdx.x; i < (int)(sizeof(HeadTables) / 4); i += blockDim.x) dst[i] = src[i];
    // Rotated query as A fragments (rows ≥ gqa and tiles ≥ n_tiles[0] are zero):
    // written by the rotation kernel, which this launch may overlap (PDL).
    const int nK = U ? NT : tables[h].n_tiles[0];
    detail::grid_dependency_wait();
    for (int i = threadIdx.x; i < NT * 32; i += blockDim.x) {
      const int kt = i >> 5, ln = i & 31, g = ln >> 2, t = ln & 3;
      const __half* r0 = qrot + (size_t)(row_base + g) * detail::kMaxTiles * 16 + kt * 16 + 2 * t;
      const __half* r1 = r0 + (size_t)8 * detail::kMaxTiles * 16;
      const bool ok = kt < nK;
      uint4 a;
      a.x = ok && g < gqa ? *reinterpret_cast<const uint32_t*>(r0) : 0u;
      a.y = ok && g + 8 < gqa ? *reinterpret_cast<const uint32_t*>(r1) : 0u;
      a.z = ok && g < gqa ? *reinterpret_cast<const uint32_t*>(r0 + 8) : 0u;
      a.w = ok && g + 8 < gqa ? *reinterpret_cast<const uint32_t*>(r1 + 8) : 0u;
      qfrag[i] = a;
    }
  }
  __syncthreads();
  if (split >= part.n_splits) return;
  if (page_lo >= page_hi) {
    detail::store_empty(part, row_base, gqa, split);
    return;
  }
  const int nK = U ? NT : T.n_tiles[0], nV = U ? NT : T.n_tiles[1];

  Codebook cbK, cbV;  // loaded per tile from shared memory (few registers live)
  float O[NT][2][4];
#pragma unroll
  for (int vt = 0; vt < NT; ++vt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int i = 0; i < 4; ++i) O[vt][hh][i] = 0.f;
  detail::RowState st;

  for (int pg = page_lo; pg < page_hi; ++pg) {
    const int k = pg - page_lo;
    if (pg + 1 < page_hi) issue(pg + 1, (k + 1) % kStages);
    detail::cp_async_commit();
    detail::cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint8_t* sb = stages + (k % kStages) * stage_bytes;
    const int valid = len - pg * packed::kPageTokens;  // tokens of this page in use (may be > 64)

    // ---- S = Σ_g n^K_g ∘ (Q̃_g · C_gᵀ), 64 tokens ----
    float S[4][2][4], Sg[4][2][4];
#pragma unroll
    for (int tt = 0; tt < 4; ++tt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int i = 0; i < 4; ++i) S[tt][hh][i] = Sg[tt][hh][i] = 0.f;
#pragma unroll
    for (int kt = 0; kt < NT; ++kt) {
      if (U || kt < nK) {
        const int grp = U ? 0 : T.tile_group[0][kt];
        const int bits = U ? UB : T.bits[0][grp];
        load_codebook(T.ptab[0][grp], bits, cbK);
        const uint32_t* rows = reinterpret_cast<const uint32_t*>(sb + (U ? kt * UB * 128 : T.tile_src[0][kt])) + lane;
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = j < bits ? rows[32 * j] : 0u;
        const uint4 a4 = qfrag[kt * 32 + lane];
        const uint32_t a[4] = {a4.x, R8 ? 0u : a4.y, a4.z, R8 ? 0u : a4.w};
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          uint32_t bf[2][2];
          decode_fragments<UB>(code_nibbles<UB>(w, bits, tt), bits, cbK, bf);
          if (R8) {
            mma_16816_top(U ? S[tt][0] : Sg[tt][0], a, bf[0][0], bf[0][1]);
            mma_16816_top(U ? S[tt][1] : Sg[tt][1], a, bf[1][0], bf[1][1]);
          } else {
            detail::mma_16816(U ? S[tt][0] : Sg[tt][0], a, bf[0][0], bf[0][1]);
            detail::mma_16816(U ? S[tt][1] : Sg[tt][1], a, bf[1][0], bf[1][1]);
          }
        }
        if (U ? kt == NT - 1 : (bool)T.tile_last[0][kt]) {
          const __half2* nk = reinterpret_cast<const __half2*>(sb + T.norm_offset[0][grp]);
#pragma unroll
          for (int tt = 0; tt < 4; ++tt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const float2 n = __half22float2(nk[8 * tt + 4 * hh + t]);
#pragma unroll
              for (int i = 0; i < (R8 ? 2 : 4); ++i) {
                if (U) {
                  S[tt][hh][i] *= (i & 1) ? n.y : n.x;  // one group: S = n ∘ (Q̃·Cᵀ)
                } else {
                  S[tt][hh][i] = fmaf((i & 1) ? n.y : n.x, Sg[tt][hh][i], S[tt][hh][i]);
                  Sg[tt][hh][i] = 0.f;
                }
              }
            }
        }
      }
    }
    if (valid < packed::kPageTokens) {
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int i = 0; i < (R8 ? 2 : 4); ++i)
            if (16 * tt + 8 * hh + 2 * t + (i & 1) >= valid) S[tt][hh][i] = -INFINITY;
    }
    float alpha[2];
    softmax_page<R8>(st, S, alpha);
#pragma unroll
    for (int vt = 0; vt < NT; ++vt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        O[vt][hh][0] *= alpha[0];
        O[vt][hh][1] *= alpha[0];
        if (!R8) {
          O[vt][hh][2] *= alpha[1];
          O[vt][hh][3] *= alpha[1];
        }
      }

    // ---- O += (P ∘ n^V_g) · C_g per value tile ----
    int cur = -1;
    uint32_t pa[4][4];
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      if (U || vt < nV) {
        const int grp = U ? 0 : T.tile_group[1][vt];
        const int bits = U ? UB : T.bits[1][grp];
        if (grp != cur) {
          cur = grp;
          if (!U) load_codebook(T.ptab[1][grp], bits, cbV);
          const __half2* nv = reinterpret_cast<const __half2*>(sb + T.norm_offset[1][grp]);
#pragma unroll
          for (int tt = 0; tt < 4; ++tt) {
            float n[4];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int tok = 16 * tt + 8 * hh + 2 * t;
              const float2 f = __half22float2(nv[tok >> 1]);
              n[2 * hh] = f.x;
              n[2 * hh + 1] = f.y;
            }
            if (valid < packed::kPageTokens) {  // warp-uniform: only the last page of a sequence
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                const int tok = 16 * tt + 8 * hh + 2 * t;
                if (tok >= valid) n[2 * hh] = 0.f;  // unwritten slots may hold NaN norms
                if (tok + 1 >= valid) n[2 * hh + 1] = 0.f;
              }
            }
            pa[tt][0] = detail::pack_half2(S[tt][0][0] * n[0], S[tt][0][1] * n[1]);
            pa[tt][1] = R8 ? 0u : detail::pack_half2(S[tt][0][2] * n[0], S[tt][0][3] * n[1]);
            pa[tt][2] = detail::pack_half2(S[tt][1][0] * n[2], S[tt][1][1] * n[3]);
            pa[tt][3] = R8 ? 0u : detail::pack_half2(S[tt][1][2] * n[2], S[tt][1][3] * n[3]);
          }
        }
        if (U) load_codebook(T.ptab[1][0], UB, cbV);
        const uint32_t* rows = reinterpret_cast<const uint32_t*>(
                                   sb + (U ? (NT + vt) * UB * 128 : T.tile_src[1][vt])) + lane;
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = j < bits ? rows[32 * j] : 0u;
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          uint32_t bf[2][2];
          decode_fragments<UB>(code_nibbles<UB>(w, bits, tt), bits, cbV, bf);
          if (R8) {
            mma_16816_top(O[vt][0], pa[tt], bf[0][0], bf[0][1]);
            mma_16816_top(O[vt][1], pa[tt], bf[1][0], bf[1][1]);
          } else {
            detail::mma_16816(O[vt][0], pa[tt], bf[0][0], bf[0][1]);
            detail::mma_16816(O[vt][1], pa[tt], bf[1][0], bf[1][1]);
          }
        }
      }
    }
    __syncwarp();
  }
  detail::allow_dependent_launch();  // the merge may start its prologue (it waits for all CTAs)
  detail::cp_async_wait<0>();
  detail::store_partial<NT>(part, row_base, gqa, split, st, O, nV);
}

/// Sets instance <D, UB, R8>'s dynamic shared-memory limit once per device
/// (and again only when a plan needs more) instead of on every call: host work
/// between the launches of a step at short T. One cache per instance.
template <int D, int UB, bool R8>
void ensure_smem(size_t smem) {
  static int set_bytes[64] = {};  // per device ordinal
  int dev = 0;
  RATEKV_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < 64;
  if (cached && set_bytes[dev] >= (int)smem) return;
  RATEKV_CUDA_CHECK(cudaFuncSetAttribute(packed_decode_kernel<D, UB, R8>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (cached) set_bytes[dev] = (int)smem;
}

template <int D, int UB, bool R8>
void launch_packed(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                   const detail::WorkspaceView& w, int pages_per_split, cudaStream_t stream) {
  const auto& dev = plan.device();
  constexpr int NT = UB > 0 ? D / 16 : detail::max_tiles_for(D);
  const size_t smem = (sizeof(HeadTables) + 15) / 16 * 16 + (size_t)NT * 32 * 16 +
                      (size_t)kWarps<UB, R8> * kStages * dev.max_stage_bytes;
  ensure_smem<D, UB, R8>(smem);
  dim3 grid((w.part.n_splits + kWarps<UB, R8> - 1) / kWarps<UB, R8>, plan.layout().n_kv_heads(),
            batch.batch);
  // Programmatic dependent launch: the prologue (head tables, page table, first
  // page) overlaps the query-rotation kernel; the kernel waits for it before
  // reading the rotated query.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(32 * kWarps<UB, R8>);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  RATEKV_CUDA_CHECK(cudaLaunchKernelEx(&cfg, packed_decode_kernel<D, UB, R8>, dev.heads, pool,
                                       plan.layout().page_bytes(), batch.page_table,
                                       batch.max_pages, batch.seq_lens, pages_per_split,
                                       plan.n_heads(), plan.gqa(), (const __half*)w.q, w.part));
}

/// Width dispatch: uniform K2V2 / K3V3 / K4V4 plans (GQA ≤ 8) get the instance with
/// compile-time widths and offsets (variant `specialized`); every other plan
/// (Block-GTQ, RateQuant, K≠V widths, 1 bit) and variant `runtime_tables` the
/// general instance (rows < 8 only when GQA ≤ 8). All compute the same numbers (tested).
template <int D>
void dispatch_bits(int ub, bool r8, const PackedPlan& plan, const DecodeBatch& batch,
                   const uint8_t* pool, const detail::WorkspaceView& w, int pps,
                   cudaStream_t stream) {
  switch (ub) {
    case 2: return launch_packed<D, 2, true>(plan, batch, pool, w, pps, stream);
    case 3: return launch_packed<D, 3, true>(plan, batch, pool, w, pps, stream);
    case 4: return launch_packed<D, 4, true>(plan, batch, pool, w, pps, stream);
    default:
      if (r8) return launch_packed<D, 0, true>(plan, batch, pool, w, pps, stream);
      return launch_packed<D, 0, false>(plan, batch, pool, w, pps, stream);
  }
}

}  // namespace

void packed_decode_attention(const PackedPlan& plan, const DecodeBatch& batch,
                             const uint8_t* pool, const uint8_t* ext_pool, const void* q,
                             DType q_dtype, float scale, float* out, void* workspace,
                             size_t workspace_bytes, int n_splits, void* stream_) {
  detail::check_batch(batch, "packed_decode_attention");
  detail::require(pool && q && out, "packed_decode_attention: pool, q and out must be device pointers");
  if (!plan.device().has_wide) {
    packed_decode_attention(plan, batch, pool, q, q_dtype, scale, out, workspace, workspace_bytes,
                            n_splits, stream_);
    return;
  }
  auto stream = static_cast<cudaStream_t>(stream_);
  const int d = plan.head_dim(), hq = plan.n_heads();
  if (n_splits <= 0) n_splits = default_splits(plan, batch.batch, batch.max_seq_len);
  const int n_pages = (batch.max_seq_len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int pps = (n_pages + n_splits - 1) / n_splits;
  const detail::WorkspaceView w =
      detail::carve_workspace(workspace, workspace_bytes, batch.batch, hq, d, n_splits);
  const auto& D = plan.device();
  detail::launch_rotate_query(q, q_dtype == DType::f16, batch.batch, hq, d, plan.gqa(), scale,
                              D.heads, D.rotations, D.channels, w.q, stream);
  detail::launch_generic_decode(plan, batch, pool, ext_pool, w, pps, stream);
  detail::launch_merge(w, batch.batch, hq, plan.gqa(), d, D.heads, D.rotations, D.channels, out,
                       stream);
}

void packed_decode_attention(const PackedPlan& plan, const DecodeBatch& batch,
                             const uint8_t* pool, const void* q, DType q_dtype, float scale,
                             float* out, void* workspace, size_t workspace_bytes, int n_splits,
                             void* stream_, PackedDecodeVariant variant) {
  detail::check_batch(batch, "packed_decode_attention");
  detail::require(!plan.device().has_wide,
                  "packed_decode_attention: the plan has 5..8-bit groups: use the overload with "
                  "ext_pool (the extension pages)");
  detail::require(pool && q && out, "packed_decode_attention: pool, q and out must be device pointers");
  auto stream = static_cast<cudaStream_t>(stream_);
  const int d = plan.head_dim(), hq = plan.n_heads();
  if (n_splits <= 0) n_splits = default_splits(plan, batch.batch, batch.max_seq_len);
  const int n_pages = (batch.max_seq_len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int pps = (n_pages + n_splits - 1) / n_splits;
  const detail::WorkspaceView w =
      detail::carve_workspace(workspace, workspace_bytes, batch.batch, hq, d, n_splits);
  const auto& D = plan.device();
  detail::launch_rotate_query(q, q_dtype == DType::f16, batch.batch, hq, d, plan.gqa(), scale,
                              D.heads, D.rotations, D.channels, w.q, stream);
  // Uniform instances hold only query rows < 8 (GQA ≤ 8); larger GQA takes the general one.
  const bool r8 = plan.gqa() <= 8;
  const int ub = variant == PackedDecodeVariant::specialized && r8 ? D.uniform_bits : 0;
  switch (d) {
    case 64: dispatch_bits<64>(ub, r8, plan, batch, pool, w, pps, stream); break;
    case 128: dispatch_bits<128>(ub, r8, plan, batch, pool, w, pps, stream); break;
    case 256: dispatch_bits<256>(ub, r8, plan, batch, pool, w, pps, stream); break;
    default:
      detail::throw_error(detail::cat("packed_decode_attention: head_dim ", d,
                                      " has no kernel (64, 128, 256)"));
  }
  detail::launch_merge(w, batch.batch, hq, plan.gqa(), d, D.heads, D.rotations, D.channels, out,
                       stream);
}

}  // namespace ratekv::cuda
