// Fused split-K decode attention over the packed KV cache for GQA 9..16 (any
// plan of 1..4-bit groups; docs/design.md §6, §8; docs/packed_format.md, format
// version 2), and the entry points that pick the kernel: GQA ≤ 8 takes
// decode_attention_gqa8.cu, plans with 5..8-bit groups
// decode_attention_generic.cu.
//
// Grid (⌈n_splits/4⌉, n_kv_heads, batch), 4 warps per CTA, one split per warp.
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
// the rotated domain. The split-K epilogue (splitk_lse_merge.cu) merges the
// split states and rotates back.
#include "attention_common.cuh"
#include "code_decode.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

using detail::Codebook;
using detail::code_nibbles;
using detail::decode_fragments;
using detail::fast_exp2;
using detail::HeadTables;
using detail::load_codebook;

namespace {

constexpr int kStages = 2;  // pages in flight per warp (current + prefetch)
// Warps (splits) per CTA; they share the head tables and the query fragments.
// 16 query rows need more registers: 4 warps, 3 CTAs per SM.
constexpr int kWarps = 4;
static_assert(detail::kPackedWarpsPerCta % kWarps == 0, "default_splits rounds to whole CTAs");

/// Online-softmax update over the 64 scores of one page (4 token tiles of
/// C fragments); on return S holds p = exp(S − m_new), alpha the rescale.
__device__ __forceinline__ void softmax_page(detail::RowState& st, float (&S)[4][2][4],
                                             float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
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

/// D: head_dim; any plan: widths/codebooks/offsets read per channel tile from the
/// head tables in shared memory; the warp's 16 query rows are the M side of
/// mma.m16n8k16 (rows ≥ gqa zero).
template <int D>
__global__ void __launch_bounds__(32 * kWarps, D > 128 ? 1 : 3) packed_decode_kernel(
    const HeadTables* __restrict__ tables, const uint8_t* __restrict__ pool, size_t page_bytes,
    const int32_t* __restrict__ page_table, int max_pages, const int32_t* __restrict__ seq_lens,
    int pages_per_split, int n_heads, int gqa, const __half* __restrict__ qrot,
    detail::Partials part) {
  constexpr int NT = detail::max_tiles_for(D);  // rotated tiles per side (max)
  extern __shared__ __align__(16) uint8_t smem[];
  HeadTables& T = *reinterpret_cast<HeadTables*>(smem);
  constexpr int kTablesBytes = (sizeof(HeadTables) + 15) / 16 * 16;
  uint4* qfrag = reinterpret_cast<uint4*>(smem + kTablesBytes);  // [NT][32] A fragments
  const int h = blockIdx.y, b = blockIdx.z;
  const int row_base = b * n_heads + h * gqa;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
  const int split = blockIdx.x * kWarps + warp;
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
    const int nK = tables[h].n_tiles[0];
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
  const int nK = T.n_tiles[0], nV = T.n_tiles[1];

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
      if (kt < nK) {
        const int grp = T.tile_group[0][kt];
        const int bits = T.bits[0][grp];
        load_codebook(T.ptab[0][grp], bits, cbK);
        const uint32_t* rows = reinterpret_cast<const uint32_t*>(sb + T.tile_src[0][kt]) + lane;
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = j < bits ? rows[32 * j] : 0u;
        const uint4 a4 = qfrag[kt * 32 + lane];
        const uint32_t a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          uint32_t bf[2][2];
          decode_fragments<0>(code_nibbles<0>(w, bits, tt), bits, cbK, bf);
          detail::mma_16816(Sg[tt][0], a, bf[0][0], bf[0][1]);
          detail::mma_16816(Sg[tt][1], a, bf[1][0], bf[1][1]);
        }
        if (T.tile_last[0][kt]) {
          const __half2* nk = reinterpret_cast<const __half2*>(sb + T.norm_offset[0][grp]);
#pragma unroll
          for (int tt = 0; tt < 4; ++tt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const float2 n = __half22float2(nk[8 * tt + 4 * hh + t]);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                S[tt][hh][i] = fmaf((i & 1) ? n.y : n.x, Sg[tt][hh][i], S[tt][hh][i]);
                Sg[tt][hh][i] = 0.f;
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
          for (int i = 0; i < 4; ++i)
            if (16 * tt + 8 * hh + 2 * t + (i & 1) >= valid) S[tt][hh][i] = -INFINITY;
    }
    float alpha[2];
    softmax_page(st, S, alpha);
#pragma unroll
    for (int vt = 0; vt < NT; ++vt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        O[vt][hh][0] *= alpha[0];
        O[vt][hh][1] *= alpha[0];
        O[vt][hh][2] *= alpha[1];
        O[vt][hh][3] *= alpha[1];
      }

    // ---- O += (P ∘ n^V_g) · C_g per value tile ----
    int cur = -1;
    uint32_t pa[4][4];
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      if (vt < nV) {
        const int grp = T.tile_group[1][vt];
        const int bits = T.bits[1][grp];
        if (grp != cur) {
          cur = grp;
          load_codebook(T.ptab[1][grp], bits, cbV);
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
            pa[tt][1] = detail::pack_half2(S[tt][0][2] * n[0], S[tt][0][3] * n[1]);
            pa[tt][2] = detail::pack_half2(S[tt][1][0] * n[2], S[tt][1][1] * n[3]);
            pa[tt][3] = detail::pack_half2(S[tt][1][2] * n[2], S[tt][1][3] * n[3]);
          }
        }
        const uint32_t* rows = reinterpret_cast<const uint32_t*>(
                                   sb + T.tile_src[1][vt]) + lane;
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = j < bits ? rows[32 * j] : 0u;
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          uint32_t bf[2][2];
          decode_fragments<0>(code_nibbles<0>(w, bits, tt), bits, cbV, bf);
          detail::mma_16816(O[vt][0], pa[tt], bf[0][0], bf[0][1]);
          detail::mma_16816(O[vt][1], pa[tt], bf[1][0], bf[1][1]);
        }
      }
    }
    __syncwarp();
  }
  detail::allow_dependent_launch();  // the merge may start its prologue (it waits for all CTAs)
  detail::cp_async_wait<0>();
  detail::store_partial<NT>(part, row_base, gqa, split, st, O, nV);
}

template <int D>
void launch_packed(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                   const detail::WorkspaceView& w, int pages_per_split, cudaStream_t stream) {
  const auto& dev = plan.device();
  constexpr int NT = detail::max_tiles_for(D);
  const size_t smem = (sizeof(HeadTables) + 15) / 16 * 16 + (size_t)NT * 32 * 16 +
                      (size_t)kWarps * kStages * dev.max_stage_bytes;
  static int smem_set[detail::kMaxDevices] = {};  // one cache per instance
  detail::set_smem_limit(reinterpret_cast<const void*>(packed_decode_kernel<D>), smem,
                         smem_set);
  const dim3 grid((w.part.n_splits + kWarps - 1) / kWarps, plan.layout().n_kv_heads(),
                  batch.batch);
  // Programmatic dependent launch: the prologue (head tables, page table, first
  // page) overlaps the query-rotation kernel; the kernel waits for it before
  // reading the rotated query.
  detail::launch_pdl(packed_decode_kernel<D>, grid, dim3(32 * kWarps), smem, stream,
                     dev.heads, pool, plan.layout().page_bytes(), batch.page_table,
                     batch.max_pages, batch.seq_lens, pages_per_split, plan.n_heads(), plan.gqa(),
                     (const __half*)w.q, w.part);
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
  detail::require_no_window(batch, "packed_decode_attention (a plan with 5..8-bit groups)");
  auto stream = static_cast<cudaStream_t>(stream_);
  const int d = plan.head_dim(), hq = plan.n_heads();
  if (n_splits <= 0) n_splits = default_splits(plan, batch.batch, batch.max_seq_len);
  const int n_pages = (batch.max_seq_len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int pps = (n_pages + n_splits - 1) / n_splits;
  const detail::WorkspaceView w =
      detail::carve_workspace(workspace, workspace_bytes, batch.batch, hq, d, n_splits);
  const auto& D = plan.device();
  detail::launch_rotate_query(q, q_dtype == DType::f16, batch.batch, hq, d, plan.gqa(), scale,
                              D.heads, D.rotations, D.channels, D.max_tiles[0] * 16, w.q, stream);
  detail::launch_generic_decode(plan, batch, pool, ext_pool, w, pps, stream);
  detail::launch_splitk_lse_merge(w, batch.batch, hq, plan.gqa(), d, D.heads, D.rotations, D.channels,
                                  out, stream);
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
  if (plan.gqa() > 8) detail::require_no_window(batch, "packed_decode_attention (GQA > 8)");
  auto stream = static_cast<cudaStream_t>(stream_);
  const int d = plan.head_dim(), hq = plan.n_heads();
  const int span = detail::decode_span(batch, packed::kPageTokens);  // max_seq_len, or the window's pages
  if (n_splits <= 0) n_splits = default_splits(plan, batch.batch, span);
  const int n_pages = (span + packed::kPageTokens - 1) / packed::kPageTokens;
  const int pps = (n_pages + n_splits - 1) / n_splits;
  const detail::WorkspaceView w =
      detail::carve_workspace(workspace, workspace_bytes, batch.batch, hq, d, n_splits);
  const auto& D = plan.device();
  detail::launch_rotate_query(q, q_dtype == DType::f16, batch.batch, hq, d, plan.gqa(), scale,
                              D.heads, D.rotations, D.channels, D.max_tiles[0] * 16, w.q, stream);
  // GQA ≤ 8: the kernel with the query rows as the MMA N side (every plan
  // under `specialized`: an integer instance, detail::gqa8_instance), which merges the splits of
  // each CTA itself and rotates back when they all fit one CTA (no merge
  // launch; every short context and every batch past one wave,
  // default_splits), else leaves one state per CTA to the merge launch;
  // GQA > 8: the 16-row kernel.
  detail::WorkspaceView wm = w;  // what the merge launch reads
  if (plan.gqa() <= 8) {
    const int per_cta = detail::gqa8_splits_per_cta(d);
    const bool fused = n_splits <= per_cta;
    detail::launch_gqa8_decode(plan, batch, pool, w, pps, uses_int8_levels(plan, variant), stream,
                               fused ? out : nullptr);
    if (fused) return;
    wm.part.n_splits = (n_splits + per_cta - 1) / per_cta;  // one merged state per CTA
  } else {
    switch (d) {
      case 64: launch_packed<64>(plan, batch, pool, w, pps, stream); break;
      case 128: launch_packed<128>(plan, batch, pool, w, pps, stream); break;
      case 256: launch_packed<256>(plan, batch, pool, w, pps, stream); break;
      default:
        detail::throw_error(detail::cat("packed_decode_attention: head_dim ", d,
                                        " has no kernel (64, 128, 256)"));
    }
  }
  detail::launch_splitk_lse_merge(wm, batch.batch, hq, plan.gqa(), d, D.heads, D.rotations, D.channels,
                                  out, stream);
}

}  // namespace ratekv::cuda
