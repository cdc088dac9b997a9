// fp16-cache decode attention for GQA ≤ 8: the fair fp16 baseline of the
// engine (issue 17; the 16-row kernel of decode_attention_fp16.cu ran at
// 0.70–0.88x torch SDPA flash for T ≥ 32K).
//
// Same page layout and split-K structure as the 16-row kernel (per (page, KV
// head): K (64, D) then V (64, D) fp16; one warp per split of 16-token tiles;
// log-sum-exp merge of the split states), with the GQA-8 kernel's orientation:
// the ≤ 8 query rows of a KV head are the N side of mma.m16n8k16, the cache
// the A side (no padding rows):
//   Sᵀ (16 tokens × 8 rows) = K_tile · Q̃ᵀ          A = K tile (ldmatrix)
//   Oᵀ (D × 8)            += V_tileᵀ · Pᵀ           A = V tile (ldmatrix.trans)
// with P's C fragments turned into B fragments by movmatrix (8×8 transposes).
// Tiles reach shared memory through 16-byte cp.async (3 stages per warp,
// zero-filled past the sequence's end) into rows whose 16-byte chunks are
// XOR-swizzled by the row (chunk c of row r at c ^ (r mod 8)), so the
// ldmatrix reads of 8 rows hit 8 different bank groups.
#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda::detail {

namespace {

constexpr int kN8Warps = 4;
template <int D>
constexpr int kN8Stages = D <= 64 ? 4 : 3;
template <int D>
constexpr int kTileBytes = 16 * D * 2;  // 16 tokens of K (or V)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // src-size 0: 16 zero bytes, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// One warp's split: its state into `part` (or the empty state).
template <int D>
__device__ __forceinline__ void n8_split(
    const __half* __restrict__ pool, int n_kv_heads, const int32_t* __restrict__ page_table,
    int max_pages, const int32_t* __restrict__ seq_lens, int window, int tiles_per_split, int n_heads, int gqa,
    const __half* __restrict__ qs, const Partials& part) {
  constexpr int NT = D / 16;           // 16-channel tiles
  constexpr int kChunks = D / 8;       // 16-byte chunks per token row
  constexpr int S = kN8Stages<D>;
  constexpr int kStage = 2 * kTileBytes<D>;  // K tile then V tile
  constexpr int kPerLane = 2 * 16 * kChunks / 32;  // cp.async per lane per tile (K and V)
  extern __shared__ __align__(128) uint8_t smem[];
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x * kN8Warps + warp;
  if (split >= part.n_splits) return;
  uint8_t* stages = smem + (size_t)warp * S * kStage;
  const uint32_t stages_s = smem_u32(stages);
  const int len = seq_lens[b];
  const int n_tiles_seq = (len + 15) / 16;
  // Sliding window (DecodeBatch::window): tokens from `first` on; the split
  // partition starts at the tile holding it.
  const int first = window > 0 ? max(0, len - window) : 0;
  const int tile_lo = first / 16 + split * tiles_per_split;
  const int tile_hi = min(tile_lo + tiles_per_split, n_tiles_seq);
  const int row_base = b * n_heads + h * gqa;
  const int32_t* pt = page_table + (size_t)b * max_pages;
  const size_t page_elems = (size_t)n_kv_heads * 2 * 64 * D;
  const size_t head_off = (size_t)h * 2 * 64 * D;

  // Loads of tile `tile` into stage `stage`: unit u = lane + 32i is chunk
  // u % kChunks of row u / kChunks of the K tile (u < 16·kChunks) or the V tile.
  auto issue = [&](int tile, int stage) {
    const __half* kb = pool + (size_t)pt[tile >> 2] * page_elems + head_off + (size_t)(tile & 3) * 16 * D;
    const int valid = len - tile * 16;
    const uint32_t dst0 = stages_s + stage * kStage;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int u = lane + 32 * i;
      const int side = u / (16 * kChunks), uu = u % (16 * kChunks);
      const int r = uu / kChunks, c = uu % kChunks;
      const __half* src = kb + (size_t)side * 64 * D + (size_t)r * D + c * 8;
      const uint32_t dst = dst0 + side * kTileBytes<D> + r * (D * 2) + ((c ^ (r & 7)) << 4);
      cp_async16_zfill(dst, src, r < valid);
    }
  };

  // The first S − 1 tiles are issued before waiting for the query kernel
  // (PDL): the cache and page table are not written by it, so their loads
  // overlap its tail; the query fragments are read after the wait.
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (tile_lo + i < tile_hi) issue(tile_lo + i, i);
    cp_async_commit();
  }
  grid_dependency_wait();  // the scaled query comes from the prologue kernel (PDL launch)
  if (tile_lo >= tile_hi) {
    store_empty(part, row_base, gqa, split);
    return;
  }
  // Query B fragments (k = channel, n = row): b0 = Q̃[g][16kt + 2t, +1], b1 = +8.
  uint32_t bq[NT][2];
#pragma unroll
  for (int kt = 0; kt < NT; ++kt) {
    const __half* r0 = qs + (size_t)(row_base + g) * kMaxTiles * 16 + kt * 16 + 2 * t;
    bq[kt][0] = g < gqa ? *reinterpret_cast<const uint32_t*>(r0) : 0u;
    bq[kt][1] = g < gqa ? *reinterpret_cast<const uint32_t*>(r0 + 8) : 0u;
  }
  float O[NT][4];  // Oᵀ: (channel 16vt + g (+8 for [2], [3]), row 2t + (i & 1))
#pragma unroll
  for (int vt = 0; vt < NT; ++vt)
#pragma unroll
    for (int i = 0; i < 4; ++i) O[vt][i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units), rows 2t, 2t+1
  float l[2] = {0.f, 0.f};

  // ldmatrix row addresses: lane L gives row (L mod 8) of matrix L / 8; the
  // swizzle key of every row it addresses is L mod 8.
  const int mi = lane >> 3, rr = lane & 7;
  // K (A of Sᵀ, non-transposed): matrix mi = rows 8(mi & 1).., channels 8(mi >> 1)..
  const int k_row = 8 * (mi & 1) + rr, k_chunk = mi >> 1;
  // V (A of Oᵀ = V_tileᵀ, transposed loads): matrix mi = tokens 8(mi >> 1).., channels 8(mi & 1)..
  const int v_row = 8 * (mi >> 1) + rr, v_chunk = mi & 1;

  for (int it = tile_lo; it < tile_hi; ++it) {
    const int k = it - tile_lo;
    if (it + S - 1 < tile_hi) issue(it + S - 1, (k + S - 1) % S);
    cp_async_commit();
    cp_async_wait<S - 1>();
    __syncwarp();
    const uint32_t sK = stages_s + (k % S) * kStage, sV = sK + kTileBytes<D>;
    const int valid = len - it * 16;

    float s[4] = {0.f, 0.f, 0.f, 0.f};  // Sᵀ: (token g (+8 for [2], [3]), row 2t + (i & 1))
#pragma unroll
    for (int kt = 0; kt < NT; ++kt) {
      uint32_t a[4];
      ldmatrix_x4(a, sK + k_row * (D * 2) + (((2 * kt + k_chunk) ^ rr) << 4));
      mma_16816(s, a, bq[kt][0], bq[kt][1]);
    }
    if (valid < 16) {
      if (g >= valid) s[0] = s[1] = -INFINITY;
      if (g + 8 >= valid) s[2] = s[3] = -INFINITY;
    }
    if (it * 16 < first) {  // warp-uniform: only the tile holding a window's first token
      const int before = first - it * 16;  // tokens of this tile left of the window (written, finite)
      if (g < before) s[0] = s[1] = -INFINITY;
      if (g + 8 < before) s[2] = s[3] = -INFINITY;
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(s[r], s[r + 2]) * kLog2e;
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(m[r], mx);  // finite: every tile has a valid token
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      const float p0 = exp2f(fmaf(s[r], kLog2e, -m_new)), p1 = exp2f(fmaf(s[r + 2], kLog2e, -m_new));
      s[r] = p0;
      s[r + 2] = p1;
      l[r] = l[r] * alpha[r] + p0 + p1;
    }
    // Pᵀ as B fragments (k = token, n = row): the 8×8 blocks of tokens 0-7 and
    // 8-15 transposed.
    const uint32_t pb0 = transpose8x8(pack_half2(s[0], s[1]));
    const uint32_t pb1 = transpose8x8(pack_half2(s[2], s[3]));
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      O[vt][0] *= alpha[0];
      O[vt][1] *= alpha[1];
      O[vt][2] *= alpha[0];
      O[vt][3] *= alpha[1];
      uint32_t a[4];
      ldmatrix_x4_trans(a, sV + v_row * (D * 2) + (((2 * vt + v_chunk) ^ rr) << 4));
      mma_16816(O[vt], a, pb0, pb1);
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  cp_async_wait<0>();
  allow_dependent_launch();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 4);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 8);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 16);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 2 * t + r;
    if (row >= gqa) continue;
    const size_t idx = (size_t)(row_base + row) * part.n_splits + split;
    if (g == 0) {
      part.m[idx] = m[r];
      part.l[idx] = l[r];
    }
    float* o = part.o + idx * part.o_dim;
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      o[vt * 16 + g] = O[vt][r];
      o[vt * 16 + g + 8] = O[vt][r + 2];
    }
  }
}

// The fused merge (Fused): after its warps' states are stored, each CTA
// counts itself in at counters[b·n_kv_heads + h]; the last of the (b, h)'s
// gridDim.x CTAs merges the row's n_splits states as splitk_lse_merge does
// (M = max m_s, w_s = 2^(m_s − M), out = Σ w_s o_s / Σ w_s l_s; empty splits
// weigh 0), thread (row r, channel quad c) reading its float4 of every split.
template <int D, bool Fused>
__global__ void __launch_bounds__(32 * kN8Warps) fp16_n8_kernel(
    const __half* __restrict__ pool, int n_kv_heads, const int32_t* __restrict__ page_table,
    int max_pages, const int32_t* __restrict__ seq_lens, int window, int tiles_per_split, int n_heads, int gqa,
    const __half* __restrict__ qs, Partials part, int* __restrict__ counters, float* __restrict__ out) {
  n8_split<D>(pool, n_kv_heads, page_table, max_pages, seq_lens, window, tiles_per_split, n_heads, gqa, qs, part);
  if constexpr (Fused) {
    __shared__ int last;
    grid_dependency_wait();  // the counters were zeroed by the query kernel (a warp past n_splits never waited)
    __threadfence();  // this thread's state stores, device-wide, before the CTA counts itself in
    __syncthreads();
    const int h = blockIdx.y, b = blockIdx.z;
    if (threadIdx.x == 0) last = atomicAdd(&counters[b * n_kv_heads + h], 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    constexpr int kQuads = D / 4, kRowsPerPass = 32 * kN8Warps / kQuads;
    const int cq = threadIdx.x % kQuads, r0 = threadIdx.x / kQuads;
    const int ns = part.n_splits, row_base = b * n_heads + h * gqa;
    for (int r = r0; r < gqa; r += kRowsPerPass) {
      const size_t base = (size_t)(row_base + r) * ns;
      float M = -INFINITY;
      for (int s = 0; s < ns; ++s) M = fmaxf(M, __ldcg(part.m + base + s));
      float L = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
      for (int s = 0; s < ns; ++s) {
        const float ms = __ldcg(part.m + base + s);
        const float w = ms == -INFINITY ? 0.f : exp2f(ms - M);  // empty splits weigh 0
        L = fmaf(w, __ldcg(part.l + base + s), L);
        const float4 o = __ldcg(reinterpret_cast<const float4*>(part.o + (base + s) * part.o_dim) + cq);
        acc.x = fmaf(w, o.x, acc.x);
        acc.y = fmaf(w, o.y, acc.y);
        acc.z = fmaf(w, o.z, acc.z);
        acc.w = fmaf(w, o.w, acc.w);
      }
      const float il = 1.f / L;
      float* dst = out + (size_t)(row_base + r) * D + 4 * cq;
      dst[0] = acc.x * il;
      dst[1] = acc.y * il;
      dst[2] = acc.z * il;
      dst[3] = acc.w * il;
    }
  }
}

template <int D, bool Fused>
void launch_d(int n_kv_heads, const DecodeBatch& batch, const uint16_t* pool, const WorkspaceView& w,
              int tiles_per_split, int n_heads, int gqa, cudaStream_t stream, float* out) {
  const size_t smem = (size_t)kN8Warps * kN8Stages<D> * 2 * kTileBytes<D>;
  static int smem_set[kMaxDevices] = {};
  set_smem_limit(reinterpret_cast<const void*>(fp16_n8_kernel<D, Fused>), smem, smem_set);
  const dim3 grid((w.part.n_splits + kN8Warps - 1) / kN8Warps, n_kv_heads, batch.batch);
  launch_pdl(fp16_n8_kernel<D, Fused>, grid, dim3(32 * kN8Warps), smem, stream,
             reinterpret_cast<const __half*>(pool), n_kv_heads, batch.page_table, batch.max_pages,
             batch.seq_lens, batch.window, tiles_per_split, n_heads, gqa, (const __half*)w.q, w.part, w.counters, out);
}

template <int D>
void launch_d(int n_kv_heads, const DecodeBatch& batch, const uint16_t* pool, const WorkspaceView& w,
              int tiles_per_split, int n_heads, int gqa, cudaStream_t stream, float* out) {
  if (out) launch_d<D, true>(n_kv_heads, batch, pool, w, tiles_per_split, n_heads, gqa, stream, out);
  else launch_d<D, false>(n_kv_heads, batch, pool, w, tiles_per_split, n_heads, gqa, stream, nullptr);
}

}  // namespace

int fp16_n8_warps_per_sm(int head_dim) {
  // Shared memory per CTA (4 warps): 64: 64 KB, 128: 96 KB, 256: 192 KB of the
  // 227 KB an SM gives: 3, 2, 1 CTAs.
  return head_dim <= 64 ? 12 : head_dim <= 128 ? 8 : 4;
}

void launch_fp16_n8(int n_kv_heads, int head_dim, const DecodeBatch& batch, const uint16_t* pool,
                    const WorkspaceView& w, int tiles_per_split, int n_heads, int gqa,
                    cudaStream_t stream, float* fused_out) {
  require(gqa >= 1 && gqa <= 8, "fp16 decode attention (GQA ≤ 8 kernel): GQA ", gqa);
  switch (head_dim) {
    case 64: return launch_d<64>(n_kv_heads, batch, pool, w, tiles_per_split, n_heads, gqa, stream, fused_out);
    case 128: return launch_d<128>(n_kv_heads, batch, pool, w, tiles_per_split, n_heads, gqa, stream, fused_out);
    case 256: return launch_d<256>(n_kv_heads, batch, pool, w, tiles_per_split, n_heads, gqa, stream, fused_out);
    default: throw_error(cat("fp16 decode attention: head_dim ", head_dim, " has no kernel (64, 128, 256)"));
  }
}

}  // namespace ratekv::cuda::detail
