// Generic split-K decode attention over the packed KV cache for plans the
// tensor-core instances do not serve: groups of 5..8 bits, whose codes are a
// low nibble in the layer's pages and the high b − 4 bits in its extension
// pages (docs/packed_format.md §5). Correctness path, no bandwidth target.
//
// Grid (n_splits, n_kv_heads, batch), 128 threads; a split is a range of
// pages of one sequence. Per chunk of 128 tokens: one thread per token
// computes the scores of the KV head's GQA query rows in each key group's
// rotated domain (the rotated fp16 query of launch_rotate_query, levels
// rounded to fp16, fp16 norms), one warp per query row does the online
// softmax (log2 units), then one thread per rotated value coordinate
// accumulates Σ_t p_t n^V_t c[idx^V_t]. The split states have the layout of
// the tensor-core kernels (detail::Partials), so the split-K epilogue
// (launch_splitk_lse_merge) merges and rotates back. Codes are read bit by bit with packed::element_pos /
// packed::code_bit_pos, the format's own definitions.
#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda::detail {

namespace {

constexpr int kThreads = 128;  // tokens per chunk
constexpr int kRows = 16;      // GQA ≤ 16
constexpr int kRotDim = kMaxTiles * 16;

/// fp16-rounded level of coordinate j of group g of side s at `slot`
/// (wide groups: low nibble from `page`, high bits from `ext_page`).
__device__ __forceinline__ float level_at(const HeadTables& T, const WideTables& W,
                                          const float* __restrict__ levels, const uint8_t* page,
                                          const uint8_t* ext_page, int s, int g, int slot, int j) {
  uint32_t code = read_code(page + T.block_offset + T.code_offset[s][g], T.bits[s][g], s, slot, j);
  const int wb = W.wide_bits[s][g];
  if (wb > 0) code |= read_code(ext_page + W.ext_code_offset[s][g], wb - packed::kMaxBits, s, slot, j) << 4;
  return __half2float(__float2half_rn(levels[T.lvl_offset[s][g] + code]));
}

__device__ __forceinline__ float norm_at(const HeadTables& T, const uint8_t* page, int s, int g,
                                         int slot) {
  return __half2float(
      *reinterpret_cast<const __half*>(page + T.block_offset + T.norm_offset[s][g] + 2 * slot));
}

__global__ void __launch_bounds__(kThreads) generic_decode_kernel(
    const HeadTables* __restrict__ tables, const WideTables* __restrict__ wide,
    const float* __restrict__ levels,
    const uint8_t* __restrict__ pool, const uint8_t* __restrict__ ext_pool, size_t page_bytes,
    size_t ext_page_bytes, const int32_t* __restrict__ page_table, int max_pages,
    const int32_t* __restrict__ seq_lens, int pages_per_split, int n_heads, int gqa,
    const __half* __restrict__ qrot, Partials part) {
  __shared__ float qs[kRows][kRotDim];  // rotated, scaled query rows (fp16 values)
  __shared__ float os[kRows][kRotDim];  // unnormalized output, rotated value domain
  __shared__ float ps[kRows][kThreads]; // scores (log2 units), then probabilities
  __shared__ float m_sh[kRows], l_sh[kRows], a_sh[kRows];
  const int h = blockIdx.y, b = blockIdx.z, split = blockIdx.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const HeadTables& T = tables[h];
  const WideTables& W = wide[h];
  const int row_base = b * n_heads + h * gqa;
  const int len = seq_lens[b];
  const int n_pages_seq = (len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int page_lo = split * pages_per_split;
  const int page_hi = min(page_lo + pages_per_split, n_pages_seq);
  if (page_lo >= page_hi) {
    if (warp == 0) store_empty(part, row_base, gqa, split);
    return;
  }
  const int nK = T.n_tiles[0] * 16, nV = T.n_tiles[1] * 16;
  for (int i = tid; i < kRows * kRotDim; i += kThreads) {
    const int r = i / kRotDim, J = i % kRotDim;
    qs[r][J] = r < gqa && J < nK ? __half2float(qrot[(size_t)(row_base + r) * kRotDim + J]) : 0.f;
    os[r][J] = 0.f;
  }
  if (tid < kRows) {
    m_sh[tid] = -INFINITY;
    l_sh[tid] = 0.f;
  }
  __syncthreads();
  const int32_t* pt = page_table + (size_t)b * max_pages;
  const int tok_lo = page_lo * packed::kPageTokens;
  const int tok_hi = min(page_hi * packed::kPageTokens, len);
  for (int c0 = tok_lo; c0 < tok_hi; c0 += kThreads) {
    // ---- scores: one thread per token ----
    const int t = c0 + tid;
    float sc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) sc[r] = 0.f;
    if (t < tok_hi) {
      const size_t pg = (size_t)pt[t / packed::kPageTokens];
      const uint8_t* page = pool + pg * page_bytes;
      const uint8_t* ext = ext_pool ? ext_pool + pg * ext_page_bytes : nullptr;
      const int slot = t % packed::kPageTokens;
      for (int g = 0; g < T.n_groups[0]; ++g) {
        const int dim = T.dim[0][g], J0 = T.tile_begin[0][g] * 16;
        float dot[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) dot[r] = 0.f;
        for (int j = 0; j < dim; ++j) {
          const float lev = level_at(T, W, levels, page, ext, 0, g, slot, j);
#pragma unroll
          for (int r = 0; r < kRows; ++r) dot[r] = fmaf(qs[r][J0 + j], lev, dot[r]);
        }
        const float n = norm_at(T, page, 0, g, slot);
#pragma unroll
        for (int r = 0; r < kRows; ++r) sc[r] = fmaf(n, dot[r], sc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < gqa) ps[r][tid] = t < tok_hi ? sc[r] * kLog2e : -INFINITY;
    __syncthreads();
    // ---- online softmax: one warp per query row ----
    for (int r = warp; r < gqa; r += kThreads / 32) {
      float mx = -INFINITY;
      for (int k = lane; k < kThreads; k += 32) mx = fmaxf(mx, ps[r][k]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_sh[r], mx);  // finite: the chunk has a valid token
      float sum = 0.f;
      for (int k = lane; k < kThreads; k += 32) {
        const float p = exp2f(ps[r][k] - m_new);  // invalid tokens: 2^−∞ = 0
        ps[r][k] = p;
        sum += p;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) {
        const float alpha = exp2f(m_sh[r] - m_new);
        a_sh[r] = alpha;
        l_sh[r] = l_sh[r] * alpha + sum;
        m_sh[r] = m_new;
      }
    }
    __syncthreads();
    // ---- values: one thread per rotated value coordinate ----
    const int n_tok = min(kThreads, tok_hi - c0);
    for (int J = tid; J < nV; J += kThreads) {
      const int g = T.tile_group[1][J / 16];
      const int j = J - T.tile_begin[1][g] * 16;
      if (j >= T.dim[1][g]) continue;  // padding coordinate: stays 0
      float acc[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = r < gqa ? os[r][J] * a_sh[r] : 0.f;
      for (int k = 0; k < n_tok; ++k) {
        const int tk = c0 + k;
        const size_t pg = (size_t)pt[tk / packed::kPageTokens];
        const uint8_t* page = pool + pg * page_bytes;
        const uint8_t* ext = ext_pool ? ext_pool + pg * ext_page_bytes : nullptr;
        const int slot = tk % packed::kPageTokens;
        const float v = norm_at(T, page, 1, g, slot) * level_at(T, W, levels, page, ext, 1, g, slot, j);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (r < gqa) acc[r] = fmaf(ps[r][k], v, acc[r]);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < gqa) os[r][J] = acc[r];
    }
    __syncthreads();  // ps and os reused by the next chunk
  }
  for (int r = 0; r < gqa; ++r) {
    const size_t idx = (size_t)(row_base + r) * part.n_splits + split;
    if (tid == 0) {
      part.m[idx] = m_sh[r];
      part.l[idx] = l_sh[r];
    }
    for (int J = tid; J < nV; J += kThreads) part.o[idx * part.o_dim + J] = os[r][J];
  }
}

}  // namespace

void launch_generic_decode(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                           const uint8_t* ext_pool, const WorkspaceView& w, int pages_per_split,
                           cudaStream_t stream) {
  const auto& D = plan.device();
  require(plan.gqa() <= kRows, "packed_decode_attention (generic kernel): GQA ", plan.gqa(),
          " > ", kRows);
  require(!D.has_wide || ext_pool != nullptr,
          "packed_decode_attention: the plan has 5..8-bit groups: ext_pool (the extension pages) "
          "must be a device pointer");
  const size_t ext_bytes = plan.ext_layout() ? plan.ext_layout()->page_bytes() : 0;
  const dim3 grid(w.part.n_splits, plan.layout().n_kv_heads(), batch.batch);
  generic_decode_kernel<<<grid, kThreads, 0, stream>>>(
      D.heads, D.wide, D.levels, pool, ext_pool, plan.layout().page_bytes(), ext_bytes, batch.page_table,
      batch.max_pages, batch.seq_lens, pages_per_split, plan.n_heads(), plan.gqa(),
      (const __half*)w.q, w.part);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ratekv::cuda::detail
