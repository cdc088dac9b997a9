// Fused split-K decode attention over the packed KV cache (DESIGN.md §6, §8;
// docs/packed_format.md).
//
// Grid (⌈n_splits/4⌉, n_kv_heads, batch), 4 warps per CTA, one split per warp.
// A warp owns the GQA query rows of one KV head (M = 16, rows ≥ gqa are zero)
// and a contiguous range of 16-token tiles of one sequence. Per tile it
// stages the tile's code planes and norms with 16-byte cp.async (NSTAGE deep),
// decodes every code once into fp16 B fragments (shared by all query rows),
// runs Q·Kᵀ per key group on tensor cores (mma.m16n8k16), folds the group norms
// into the scores, updates the online softmax, folds the value norms into P and
// runs P·V per value tile on tensor cores, accumulating in the rotated domain.
// The split states {o, m, l} are merged and rotated back by merge_kernel.
#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

using detail::HeadTables;

namespace {

constexpr int kStages = 4;

/// Decodes the 8 codes this lane owns in one 16×16 tile (b planes at src,
/// plane j at src + 32·j) into the two n-halves' B fragments.
__device__ __forceinline__ void decode_tile(const uint8_t* __restrict__ src, int bits,
                                            const __half* __restrict__ lv, uint32_t (&b)[2][2]) {
  const int lane = threadIdx.x & 31;
  uint32_t w = src[lane];
  if (bits > 1) w |= (uint32_t)src[32 + lane] << 8;
  if (bits > 2) w |= (uint32_t)src[64 + lane] << 16;
  if (bits > 3) w |= (uint32_t)src[96 + lane] << 24;
  __half v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const uint32_t code =
        ((w >> e) & 1u) | ((w >> (e + 7)) & 2u) | ((w >> (e + 14)) & 4u) | ((w >> (e + 21)) & 8u);
    v[e] = lv[code];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    b[h][0] = detail::pack_halves(v[4 * h], v[4 * h + 1]);
    b[h][1] = detail::pack_halves(v[4 * h + 2], v[4 * h + 3]);
  }
}

/// Variant 2 (default): two codes per lookup. The lane's b plane bytes sit in
/// one word w (plane j in byte j); for the element pair (e, e+1) the index
/// gathers bits e, e+1 of every plane (bit 2j+p = plane j of element e+p) and
/// the pair table returns both fp16 levels as one half2 B-fragment register.
/// CB > 0: bit width known at compile time (uniform plans); CB = 0: `bits`.
template <int CB>
__device__ __forceinline__ void decode_tile_lut(const uint8_t* __restrict__ src, int bits,
                                                const uint32_t* __restrict__ lut,
                                                uint32_t (&b)[2][2]) {
  const int lane = threadIdx.x & 31;
  const int nb = CB ? CB : bits;
  uint32_t w = src[lane];
  if (nb > 1) w |= (uint32_t)src[32 + lane] << 8;
  if (nb > 2) w |= (uint32_t)src[64 + lane] << 16;
  if (nb > 3) w |= (uint32_t)src[96 + lane] << 24;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t x = (w >> (2 * k)) & 0x03030303u;
    uint32_t idx;
    if (CB == 0)
      idx = (x | (x >> 6) | (x >> 12) | (x >> 18)) & 0xffu;
    else
      idx = (x | (CB > 1 ? x >> 6 : 0u) | (CB > 2 ? x >> 12 : 0u) | (CB > 3 ? x >> 18 : 0u)) &
            ((1u << (2 * CB)) - 1u);
    b[k >> 1][k & 1] = lut[idx];
  }
}

/// Builds the pair tables of this CTA's head in shared memory.
__device__ void build_pair_luts(const HeadTables& T, uint32_t* lut) {
  for (int s = 0; s < 2; ++s)
    for (int g = 0; g < T.n_groups[s]; ++g) {
      const int bits = T.bits[s][g], n = 1 << (2 * bits);
      const __half* lv = reinterpret_cast<const __half*>(T.levels[s][g]);
      for (int idx = threadIdx.x; idx < n; idx += blockDim.x) {
        int c0 = 0, c1 = 0;
        for (int j = 0; j < bits; ++j) {
          c0 |= ((idx >> (2 * j)) & 1) << j;
          c1 |= ((idx >> (2 * j + 1)) & 1) << j;
        }
        lut[T.lut_offset[s][g] + idx] = detail::pack_halves(lv[c0], lv[c1]);
      }
    }
}

/// D: head_dim; kPairLut: decode variant; UB > 0: uniform plan (one key and
/// one value group over the whole head, both UB bits) with every table offset
/// known at compile time; UB = 0: any plan, tables read from shared memory.
template <int D, bool kPairLut, int UB>
__global__ void __launch_bounds__(128, (UB > 0 && D <= 128) ? 4 : 1) packed_decode_kernel(
    const HeadTables* __restrict__ tables, const uint8_t* __restrict__ pool, size_t page_bytes,
    const int32_t* __restrict__ page_table, int max_pages, const int32_t* __restrict__ seq_lens,
    int tiles_per_split, int n_heads, int gqa, const __half* __restrict__ qrot,
    detail::Partials part) {
  constexpr bool U = UB > 0;
  constexpr int NT = U ? D / 16 : detail::max_tiles_for(D);  // tiles held in registers
  extern __shared__ __align__(16) uint8_t smem[];
  HeadTables& T = *reinterpret_cast<HeadTables*>(smem);
  const int h = blockIdx.y, b = blockIdx.z;
  {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(tables + h);
    uint32_t* dst = reinterpret_cast<uint32_t*>(smem);
    for (int i = threadIdx.x; i < (int)(sizeof(HeadTables) / 4); i += blockDim.x) dst[i] = src[i];
  }
  __syncthreads();
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + (sizeof(HeadTables) + 15) / 16 * 16);
  if (kPairLut) {
    build_pair_luts(T, lut);
    __syncthreads();
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x * detail::kWarpsPerCta + warp;
  if (split >= part.n_splits) return;
  const int stage_bytes = T.stage_bytes;
  uint8_t* stages = reinterpret_cast<uint8_t*>(lut + (kPairLut ? T.lut_words : 0)) +
                    (size_t)warp * kStages * stage_bytes;
  const int len = seq_lens[b];
  const int n_tiles_seq = (len + 15) / 16;
  const int tile_lo = split * tiles_per_split;
  const int tile_hi = min(tile_lo + tiles_per_split, n_tiles_seq);
  const int row_base = b * n_heads + h * gqa;
  if (tile_lo >= tile_hi) {
    detail::store_empty(part, row_base, gqa, split);
    return;
  }

  // Rotated query as A fragments (rows ≥ gqa are zero).
  uint32_t aq[NT][4];
  const int nK = U ? NT : T.n_tiles[0], nV = U ? NT : T.n_tiles[1];
#pragma unroll
  for (int kt = 0; kt < NT; ++kt) {
    const __half* r0 = qrot + (size_t)(row_base + g) * detail::kMaxTiles * 16 + kt * 16 + 2 * t;
    const __half* r1 = r0 + (size_t)8 * detail::kMaxTiles * 16;
    const bool ok = kt < nK;
    aq[kt][0] = ok && g < gqa ? *reinterpret_cast<const uint32_t*>(r0) : 0u;
    aq[kt][1] = ok && g + 8 < gqa ? *reinterpret_cast<const uint32_t*>(r1) : 0u;
    aq[kt][2] = ok && g < gqa ? *reinterpret_cast<const uint32_t*>(r0 + 8) : 0u;
    aq[kt][3] = ok && g + 8 < gqa ? *reinterpret_cast<const uint32_t*>(r1 + 8) : 0u;
  }

  const int32_t* pt = page_table + (size_t)b * max_pages;
  const uint8_t* head_base = pool + T.block_offset;
  auto issue = [&](int tile, int stage) {
    const uint8_t* base = head_base + (size_t)pt[tile >> 2] * page_bytes;
    const int sub = tile & 3;
    uint8_t* dst = stages + stage * stage_bytes;
    for (int p = 0; p < T.n_pieces; ++p) {
      const int size = T.piece_size[p];
      const uint8_t* src = base + T.piece_src[p] + sub * size;
      for (int u = lane * 16; u < size; u += 32 * 16) detail::cp_async16(dst + T.piece_dst[p] + u, src + u);
    }
  };

  float O[NT][2][4];
#pragma unroll
  for (int vt = 0; vt < NT; ++vt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int i = 0; i < 4; ++i) O[vt][hh][i] = 0.f;
  detail::RowState st;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (tile_lo + i < tile_hi) issue(tile_lo + i, i);
    detail::cp_async_commit();
  }
  for (int it = tile_lo; it < tile_hi; ++it) {
    const int k = it - tile_lo;
    if (it + kStages - 1 < tile_hi) issue(it + kStages - 1, (k + kStages - 1) % kStages);
    detail::cp_async_commit();
    detail::cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint8_t* sb = stages + (k % kStages) * stage_bytes;
    const int valid = min(16, len - it * 16);

    // ---- S = Σ_g n^K_g ∘ (Q̃_g · C_gᵀ) ----
    float S[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    float Sg[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kt = 0; kt < NT; ++kt) {
      if (U || kt < nK) {
        const int grp = U ? 0 : T.tile_group[0][kt];
        uint32_t bf[2][2];
        if (U)
          decode_tile_lut<UB>(sb + kt * UB * 32, UB, lut, bf);
        else if (kPairLut)
          decode_tile_lut<0>(sb + T.tile_src[0][kt], T.bits[0][grp], lut + T.lut_offset[0][grp], bf);
        else
          decode_tile(sb + T.tile_src[0][kt], T.bits[0][grp],
                      reinterpret_cast<const __half*>(T.levels[0][grp]), bf);
        detail::mma_16816(Sg[0], aq[kt], bf[0][0], bf[0][1]);
        detail::mma_16816(Sg[1], aq[kt], bf[1][0], bf[1][1]);
        if (U ? kt == NT - 1 : (bool)T.tile_last[0][kt]) {
          const __half* nk = reinterpret_cast<const __half*>(sb + (U ? 4 * D * UB : T.norm_dst[0][grp]));
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              S[hh][i] = fmaf(__half2float(nk[8 * hh + 2 * t + (i & 1)]), Sg[hh][i], S[hh][i]);
              Sg[hh][i] = 0.f;
            }
        }
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (8 * hh + 2 * t + (i & 1) >= valid) S[hh][i] = -INFINITY;
    float alpha[2];
    st.update(S, alpha);
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
    uint32_t pa[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      if (U || vt < nV) {
        const int grp = U ? 0 : T.tile_group[1][vt];
        if (grp != cur) {
          cur = grp;
          const __half* nv =
              reinterpret_cast<const __half*>(sb + (U ? 4 * D * UB + 32 : T.norm_dst[1][grp]));
          float n[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int tok = 8 * (j >> 1) + 2 * t + (j & 1);
            n[j] = tok < valid ? __half2float(nv[tok]) : 0.f;
          }
          pa[0] = detail::pack_half2(S[0][0] * n[0], S[0][1] * n[1]);
          pa[1] = detail::pack_half2(S[0][2] * n[0], S[0][3] * n[1]);
          pa[2] = detail::pack_half2(S[1][0] * n[2], S[1][1] * n[3]);
          pa[3] = detail::pack_half2(S[1][2] * n[2], S[1][3] * n[3]);
        }
        uint32_t bf[2][2];
        if (U)
          decode_tile_lut<UB>(sb + (NT + vt) * UB * 32, UB, lut + (1 << (2 * UB)), bf);
        else if (kPairLut)
          decode_tile_lut<0>(sb + T.tile_src[1][vt], T.bits[1][grp], lut + T.lut_offset[1][grp], bf);
        else
          decode_tile(sb + T.tile_src[1][vt], T.bits[1][grp],
                      reinterpret_cast<const __half*>(T.levels[1][grp]), bf);
        detail::mma_16816(O[vt][0], pa, bf[0][0], bf[0][1]);
        detail::mma_16816(O[vt][1], pa, bf[1][0], bf[1][1]);
      }
    }
    __syncwarp();
  }
  detail::cp_async_wait<0>();
  detail::store_partial<NT>(part, row_base, gqa, split, st, O, nV);
}

template <int D, bool kPairLut, int UB>
void launch_packed(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                   const detail::WorkspaceView& w, int tiles_per_split, cudaStream_t stream) {
  const auto& dev = plan.device();
  const size_t smem = (sizeof(HeadTables) + 15) / 16 * 16 +
                      (kPairLut ? (size_t)dev.max_lut_words * 4 : 0) +
                      (size_t)detail::kWarpsPerCta * kStages * dev.max_stage_bytes;
  RATEKV_CUDA_CHECK(cudaFuncSetAttribute(packed_decode_kernel<D, kPairLut, UB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  dim3 grid((w.part.n_splits + detail::kWarpsPerCta - 1) / detail::kWarpsPerCta,
            plan.layout().n_kv_heads(), batch.batch);
  packed_decode_kernel<D, kPairLut, UB><<<grid, 32 * detail::kWarpsPerCta, smem, stream>>>(
      dev.heads, pool, plan.layout().page_bytes(), batch.page_table, batch.max_pages,
      batch.seq_lens, tiles_per_split, plan.n_heads(), plan.gqa(), w.q, w.part);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

/// Bit-width dispatch: uniform K2V2 / K3V3 / K4V4 plans get the kernel with
/// compile-time widths and offsets; every other plan (Block-GTQ, RateQuant,
/// K≠V widths, 1 bit) the general kernel, which reads widths and offsets from
/// the head tables. Both compute the same numbers (tested).
template <int D>
void dispatch_bits(bool lut, int ub, const PackedPlan& plan, const DecodeBatch& batch,
                   const uint8_t* pool, const detail::WorkspaceView& w, int tps,
                   cudaStream_t stream) {
  if (!lut) return launch_packed<D, false, 0>(plan, batch, pool, w, tps, stream);
  switch (ub) {
    case 2: return launch_packed<D, true, 2>(plan, batch, pool, w, tps, stream);
    case 3: return launch_packed<D, true, 3>(plan, batch, pool, w, tps, stream);
    case 4: return launch_packed<D, true, 4>(plan, batch, pool, w, tps, stream);
    default: return launch_packed<D, true, 0>(plan, batch, pool, w, tps, stream);
  }
}

}  // namespace

void packed_decode_attention(const PackedPlan& plan, const DecodeBatch& batch,
                             const uint8_t* pool, const void* q, DType q_dtype, float scale,
                             float* out, void* workspace, size_t workspace_bytes, int n_splits,
                             void* stream_, PackedDecodeVariant variant) {
  detail::check_batch(batch, "packed_decode_attention");
  detail::require(pool && q && out, "packed_decode_attention: pool, q and out must be device pointers");
  auto stream = static_cast<cudaStream_t>(stream_);
  const int d = plan.head_dim(), hq = plan.n_heads();
  if (n_splits <= 0) n_splits = default_splits(batch.batch, plan.layout().n_kv_heads(), batch.max_seq_len);
  const int n_tiles = (batch.max_seq_len + 15) / 16;
  const int tps = (n_tiles + n_splits - 1) / n_splits;
  const detail::WorkspaceView w =
      detail::carve_workspace(workspace, workspace_bytes, batch.batch, hq, d, n_splits);
  const auto& D = plan.device();
  detail::launch_rotate_query(q, q_dtype == DType::f16, batch.batch, hq, d, plan.gqa(), scale,
                              D.heads, D.rotations, D.channels, w.q, stream);
  const bool lut = variant == PackedDecodeVariant::pair_lut;
  const int ub = lut ? D.uniform_bits : 0;
  switch (d) {
    case 64: dispatch_bits<64>(lut, ub, plan, batch, pool, w, tps, stream); break;
    case 128: dispatch_bits<128>(lut, ub, plan, batch, pool, w, tps, stream); break;
    case 256: dispatch_bits<256>(lut, ub, plan, batch, pool, w, tps, stream); break;
    default:
      detail::throw_error(detail::cat("packed_decode_attention: head_dim ", d,
                                      " has no kernel (64, 128, 256)"));
  }
  detail::launch_merge(w, batch.batch, hq, plan.gqa(), d, D.heads, D.rotations, D.channels, out,
                       stream);
}

}  // namespace ratekv::cuda
