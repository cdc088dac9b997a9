// Split-K decode attention over the vq pages (docs/packed_format.md §7):
// TaSQ / CQ sides (codebook lookup × shared fp16 scale; keys pre-RoPE, rotated
// at the key's position) and fp16 sides. Correctness path (docs/design.md §8: TaSQ
// plans have no bandwidth target): fp32 arithmetic, no tensor cores.
//
// Grid (n_splits, n_kv_heads, batch), 128 threads; a split is a range of
// pages of one sequence. Per chunk of 16 tokens: the keys are decoded into
// shared memory (one thread per (token, group): read the index from the bit
// stream, write s · C̃[z] to the group's channels), rotated by RoPE at their
// positions (one thread per (token, RoPE block), angle in double), scored
// against the GQA query rows (one thread per (token, row)), one warp per row
// runs the online softmax (log2 units), then the values are decoded into the
// same buffer and accumulated (one thread per channel). The split states have
// the layout of detail::Partials (o unrotated, o_dim stride); the split-K
// epilogue (launch_splitk_lse_merge) with no tables merges them.
#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"
#include "vq_tables.h"

namespace ratekv::cuda {

namespace {

using detail::kVqMaxGqa;
using detail::kVqMaxHeadDim;
using detail::kVqMaxOut;
using detail::VqTables;

constexpr int kThreads = 128;
constexpr int kChunk = 16;  // tokens decoded per round

/// Index of group gi at `slot` from a vq segment (bit stream, slot-major,
/// docs/packed_format.md §7.2), read byte by byte (≤ 3 bytes: p₀ mod 8 + bits ≤ 23).
__device__ __forceinline__ uint32_t read_index(const uint8_t* __restrict__ seg, int n_groups,
                                               int bits, int slot, int gi) {
  const uint32_t p0 = ((uint32_t)slot * n_groups + gi) * bits;
  const uint8_t* b = seg + (p0 >> 3);
  const int sh = p0 & 7, nb = (sh + bits + 7) >> 3;
  uint32_t w = 0;
  for (int i = 0; i < nb; ++i) w |= (uint32_t)b[i] << (8 * i);
  return (w >> sh) & ((1u << bits) - 1u);
}

/// Decodes side s of tokens c0 … c0+kChunk−1 (zeros past tok_hi) of KV head h
/// into xs[k][channel]: s_t · C̃[z] (vq) or the fp16 row.
__device__ void decode_side(const VqTables& T, int s, int h, const uint8_t* __restrict__ pool,
                            const uint8_t* __restrict__ scalar_pool, const int32_t* __restrict__ pt,
                            int c0, int tok_hi, float (*xs)[kVqMaxOut]) {
  const int d = T.head_dim, tid = threadIdx.x;
  if (s == 1 && T.scalar_values) {  // rotated value coordinates J of the scalar groups
    const detail::HeadTables& H = T.heads[h];
    const int nV = H.n_tiles[1] * 16;
    for (int i = tid; i < kChunk * nV; i += kThreads) {
      const int k = i / nV, J = i % nV, t = c0 + k;
      const int g = H.tile_group[1][J / 16], j = J - H.tile_begin[1][g] * 16;
      float v = 0.f;
      if (t < tok_hi && j < H.dim[1][g]) {
        const int slot = t % packed::kPageTokens;
        const uint8_t* page = scalar_pool + (size_t)pt[t / packed::kPageTokens] * T.scalar_page_bytes + H.block_offset;
        const uint32_t code = detail::read_code(page + H.code_offset[1][g], H.bits[1][g], 1, slot, j);
        const float n = __half2float(*reinterpret_cast<const __half*>(page + H.norm_offset[1][g] + 2 * slot));
        v = n * T.levels[H.lvl_offset[1][g] + code];
      }
      xs[k][J] = v;
    }
    return;
  }
  if (T.kind[s] == detail::kVqKindFp16) {
    for (int i = tid; i < kChunk * d; i += kThreads) {
      const int k = i / d, c = i % d, t = c0 + k;
      float v = 0.f;
      if (t < tok_hi) {
        const uint8_t* page = pool + (size_t)pt[t / packed::kPageTokens] * T.page_bytes;
        const __half* row = reinterpret_cast<const __half*>(
            page + h * T.head_bytes + T.seg_offset[s] + (size_t)(t % packed::kPageTokens) * d * 2);
        v = __half2float(row[c]);
      }
      xs[k][c] = v;
    }
    return;
  }
  const int G = T.n_groups[s], g = T.group_size[s], bits = T.bits[s];
  const float* cw = T.codewords + T.cw_offset[h * 2 + s];
  const int32_t* ch = T.channels + T.ch_offset[h * 2 + s];
  for (int i = tid; i < kChunk * G; i += kThreads) {
    const int k = i / G, gi = i % G, t = c0 + k;
    const int32_t* chg = ch + (size_t)gi * g;
    if (t >= tok_hi) {
      for (int j = 0; j < g; ++j) xs[k][chg[j]] = 0.f;
      continue;
    }
    const uint8_t* page = pool + (size_t)pt[t / packed::kPageTokens] * T.page_bytes;
    const int slot = t % packed::kPageTokens;
    const uint32_t z = read_index(page + h * T.head_bytes + T.seg_offset[s], G, bits, slot, gi);
    const float sc = T.shared[s]
                         ? __half2float(*reinterpret_cast<const __half*>(page + T.scale_offset[s] + 2 * slot))
                         : 1.f;
    const float* c = cw + ((size_t)gi * ((size_t)1 << bits) + z) * g;
    for (int j = 0; j < g; ++j) xs[k][chg[j]] = sc * c[j];
  }
}

__global__ void __launch_bounds__(kThreads) vq_decode_kernel(
    const VqTables T, const uint8_t* __restrict__ pool, const uint8_t* __restrict__ scalar_pool,
    const int32_t* __restrict__ page_table,
    int max_pages, const int32_t* __restrict__ seq_lens, int pages_per_split, int n_heads, int gqa,
    const void* __restrict__ q, int q_f16, float scale, detail::Partials part) {
  __shared__ float qs[kVqMaxGqa][kVqMaxHeadDim];  // scale · q, fp32
  __shared__ float xs[kChunk][kVqMaxOut];         // decoded keys, then values
  __shared__ float ps[kVqMaxGqa][kChunk];         // scores (log2 units), then p
  __shared__ float m_sh[kVqMaxGqa], l_sh[kVqMaxGqa], a_sh[kVqMaxGqa];
  const int h = blockIdx.y, b = blockIdx.z, split = blockIdx.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, d = T.head_dim;
  const int row_base = b * n_heads + h * gqa;
  const int len = seq_lens[b];
  const int n_pages_seq = (len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int page_lo = split * pages_per_split;
  const int page_hi = min(page_lo + pages_per_split, n_pages_seq);
  if (page_lo >= page_hi) {
    if (warp == 0) detail::store_empty(part, row_base, gqa, split);
    return;
  }
  for (int i = tid; i < gqa * d; i += kThreads) {
    const size_t at = (size_t)row_base * d + i;
    const float x = q_f16 ? __half2float(static_cast<const __half*>(q)[at]) : static_cast<const float*>(q)[at];
    qs[i / d][i % d] = scale * x;
  }
  if (tid < kVqMaxGqa) {
    m_sh[tid] = -INFINITY;
    l_sh[tid] = 0.f;
  }
  constexpr int kCols = (kVqMaxOut + kThreads - 1) / kThreads;
  float acc[kVqMaxGqa][kCols];  // output column tid + kThreads·i of each row
#pragma unroll
  for (int r = 0; r < kVqMaxGqa; ++r)
#pragma unroll
    for (int i = 0; i < kCols; ++i) acc[r][i] = 0.f;
  // Output columns: channels, or the scalar value side's rotated coordinates.
  const int n_out = T.scalar_values ? T.heads[h].n_tiles[1] * 16 : d;
  const int32_t* pt = page_table + (size_t)b * max_pages;
  const int tok_lo = page_lo * packed::kPageTokens;
  const int tok_hi = min(page_hi * packed::kPageTokens, len);
  const bool rope = T.kind[0] == detail::kVqKindVq;  // fp16 keys are stored post-RoPE
  const int half = d / 2, step = T.neox ? 1 : 2, off = T.neox ? half : 1;
  for (int c0 = tok_lo; c0 < tok_hi; c0 += kChunk) {
    __syncthreads();  // previous chunk done with xs, ps (and qs written)
    decode_side(T, 0, h, pool, scalar_pool, pt, c0, tok_hi, xs);
    __syncthreads();
    if (rope) {
      for (int i = tid; i < kChunk * half; i += kThreads) {
        const int k = i / half, blk = i % half;
        double sn, cs;
        sincos((double)(c0 + k) * T.freq[blk], &sn, &cs);
        const float c = (float)cs, s = (float)sn;
        float* pa = &xs[k][blk * step];
        float* pb = pa + off;
        const float a = *pa, bb = *pb;
        *pa = a * c - bb * s;
        *pb = a * s + bb * c;
      }
      __syncthreads();
    }
    for (int i = tid; i < kChunk * gqa; i += kThreads) {
      const int k = i / gqa, r = i % gqa;
      float dot = 0.f;
      for (int c = 0; c < d; ++c) dot = fmaf(qs[r][c], xs[k][c], dot);
      ps[r][k] = c0 + k < tok_hi ? dot * detail::kLog2e : -INFINITY;
    }
    __syncthreads();
    for (int r = warp; r < gqa; r += kThreads / 32) {
      const float x = lane < kChunk ? ps[r][lane] : -INFINITY;
      float mx = x;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_sh[r], mx);  // finite: the chunk has a valid token
      const float p = exp2f(x - m_new);
      float sum = p;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp();
      if (lane < kChunk) ps[r][lane] = p;
      if (lane == 0) {
        const float alpha = exp2f(m_sh[r] - m_new);
        a_sh[r] = alpha;
        l_sh[r] = l_sh[r] * alpha + sum;
        m_sh[r] = m_new;
      }
    }
    __syncthreads();
    decode_side(T, 1, h, pool, scalar_pool, pt, c0, tok_hi, xs);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int c = tid + kThreads * i;
      if (c >= n_out) break;
#pragma unroll
      for (int r = 0; r < kVqMaxGqa; ++r) {
        if (r >= gqa) break;
        float a = acc[r][i] * a_sh[r];
#pragma unroll
        for (int k = 0; k < kChunk; ++k) a = fmaf(ps[r][k], xs[k][c], a);
        acc[r][i] = a;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kVqMaxGqa; ++r) {
    if (r >= gqa) break;
    const size_t idx = (size_t)(row_base + r) * part.n_splits + split;
    if (tid == 0) {
      part.m[idx] = m_sh[r];
      part.l[idx] = l_sh[r];
    }
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int c = tid + kThreads * i;
      if (c < n_out) part.o[idx * part.o_dim + c] = acc[r][i];
    }
  }
}

}  // namespace

void vq_decode_attention(const VqPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                         const uint8_t* scalar_pool, const void* q, DType q_dtype, float scale,
                         float* out, void* workspace, size_t workspace_bytes, int n_splits,
                         void* stream_) {
  detail::check_batch(batch, "vq_decode_attention");
  detail::require_no_window(batch, "vq_decode_attention");
  detail::require(pool && q && out, "vq_decode_attention: pool, q and out must be device pointers");
  const PackedPlan* sv = plan.scalar_values();
  detail::require(!sv || scalar_pool, "vq_decode_attention: the values are a scalar TQ-MSE side: "
                  "scalar_pool (the layer's scalar pages) must be a device pointer");
  auto stream = static_cast<cudaStream_t>(stream_);
  const int d = plan.head_dim(), hq = plan.n_heads();
  if (n_splits <= 0) n_splits = default_splits(plan, batch.batch, batch.max_seq_len);
  const int n_pages = (batch.max_seq_len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int pps = (n_pages + n_splits - 1) / n_splits;
  const detail::WorkspaceView w =
      detail::carve_workspace(workspace, workspace_bytes, batch.batch, hq, d, n_splits);
  const dim3 grid(n_splits, plan.n_kv_heads(), batch.batch);
  vq_decode_kernel<<<grid, kThreads, 0, stream>>>(plan.device().t, pool, scalar_pool, batch.page_table,
                                                  batch.max_pages, batch.seq_lens, pps, hq,
                                                  plan.gqa(), q, q_dtype == DType::f16 ? 1 : 0,
                                                  scale, w.part);
  RATEKV_CUDA_CHECK(cudaGetLastError());
  if (sv)  // back-rotation of the scalar value groups (their key side is empty)
    detail::launch_splitk_lse_merge(w, batch.batch, hq, plan.gqa(), d, sv->device().heads,
                                    sv->device().rotations, sv->device().channels, out, stream);
  else
    detail::launch_splitk_lse_merge(w, batch.batch, hq, plan.gqa(), d, nullptr, nullptr, nullptr, out,
                                    stream);
}

}  // namespace ratekv::cuda
