// fp16-cache decode attention with the same structure as the packed kernel
// (pages of 64 tokens, split-K over 16-token tiles, one warp per split, GQA
// rows as M of mma.m16n8k16, online softmax, log-sum-exp merge): the baseline
// the packed kernel is measured against and checked with.
//
// Page layout: per (page, KV head) K (64, head_dim) then V (64, head_dim) fp16.
#include <algorithm>

#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

namespace {

constexpr int kStages = 2;

template <int D>
__global__ void __launch_bounds__(128) fp16_decode_kernel(
    const __half* __restrict__ pool, int n_kv_heads, const int32_t* __restrict__ page_table,
    int max_pages, const int32_t* __restrict__ seq_lens, int window, int tiles_per_split, int n_heads, int gqa,
    const __half* __restrict__ qs, detail::Partials part) {
  constexpr int NT = D / 16;
  constexpr int kRow = D * 2 + 16;       // padded smem row (bytes): conflict-free fragment loads
  constexpr int kStage = 2 * 16 * kRow;  // K tile then V tile
  extern __shared__ __align__(16) uint8_t smem[];
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x * detail::kWarpsPerCta + warp;
  if (split >= part.n_splits) return;
  uint8_t* stages = smem + (size_t)warp * kStages * kStage;
  const int len = seq_lens[b];
  const int n_tiles_seq = (len + 15) / 16;
  // Sliding window (DecodeBatch::window): tokens from `first` on; the split
  // partition starts at the tile holding it.
  const int first = window > 0 ? max(0, len - window) : 0;
  const int tile_lo = first / 16 + split * tiles_per_split;
  const int tile_hi = min(tile_lo + tiles_per_split, n_tiles_seq);
  const int row_base = b * n_heads + h * gqa;
  if (tile_lo >= tile_hi) {
    detail::store_empty(part, row_base, gqa, split);
    return;
  }
  uint32_t aq[NT][4];
#pragma unroll
  for (int kt = 0; kt < NT; ++kt) {
    const __half* r0 = qs + (size_t)(row_base + g) * detail::kMaxTiles * 16 + kt * 16 + 2 * t;
    const __half* r1 = r0 + (size_t)8 * detail::kMaxTiles * 16;
    aq[kt][0] = g < gqa ? *reinterpret_cast<const uint32_t*>(r0) : 0u;
    aq[kt][1] = g + 8 < gqa ? *reinterpret_cast<const uint32_t*>(r1) : 0u;
    aq[kt][2] = g < gqa ? *reinterpret_cast<const uint32_t*>(r0 + 8) : 0u;
    aq[kt][3] = g + 8 < gqa ? *reinterpret_cast<const uint32_t*>(r1 + 8) : 0u;
  }
  const int32_t* pt = page_table + (size_t)b * max_pages;
  const size_t page_elems = (size_t)n_kv_heads * 2 * 64 * D;
  auto issue = [&](int tile, int stage) {
    const __half* kb = pool + (size_t)pt[tile >> 2] * page_elems + (size_t)h * 2 * 64 * D +
                       (size_t)(tile & 3) * 16 * D;
    uint8_t* dst = stages + stage * kStage;
    constexpr int kUnits = 16 * D / 8;  // 16-byte units per 16-token K (or V) tile
    for (int u = lane; u < 2 * kUnits; u += 32) {
      const int side = u / kUnits, uu = u % kUnits, r = uu / (D / 8), c = uu % (D / 8);
      detail::cp_async16(dst + side * 16 * kRow + r * kRow + c * 16,
                         kb + (size_t)side * 64 * D + (size_t)r * D + c * 8);
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
    uint8_t* sb = stages + (k % kStages) * kStage;
    const int valid = min(16, len - it * 16);
    if (valid < 16) {  // unwritten V rows may hold NaN bit patterns: 0·NaN = NaN
      uint32_t* vrows = reinterpret_cast<uint32_t*>(sb + 16 * kRow);
      for (int i = valid * kRow / 4 + lane; i < 16 * kRow / 4; i += 32) vrows[i] = 0u;
      __syncwarp();
    }
    const uint8_t* Ks = sb;
    const uint8_t* Vs = sb + 16 * kRow;
    float S[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kt = 0; kt < NT; ++kt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint8_t* row = Ks + (8 * hh + g) * kRow + (kt * 16 + 2 * t) * 2;
        detail::mma_16816(S[hh], aq[kt], *reinterpret_cast<const uint32_t*>(row),
                          *reinterpret_cast<const uint32_t*>(row + 16));
      }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (8 * hh + 2 * t + (i & 1) >= valid) S[hh][i] = -INFINITY;
    if (it * 16 < first) {  // warp-uniform: only the tile holding a window's first token (written, finite)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (it * 16 + 8 * hh + 2 * t + (i & 1) < first) S[hh][i] = -INFINITY;
    }
    float alpha[2];
    st.update(S, alpha);
    uint32_t pa[4];
    pa[0] = detail::pack_half2(S[0][0], S[0][1]);
    pa[1] = detail::pack_half2(S[0][2], S[0][3]);
    pa[2] = detail::pack_half2(S[1][0], S[1][1]);
    pa[3] = detail::pack_half2(S[1][2], S[1][3]);
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        O[vt][hh][0] *= alpha[0];
        O[vt][hh][1] *= alpha[0];
        O[vt][hh][2] *= alpha[1];
        O[vt][hh][3] *= alpha[1];
        const __half* col = reinterpret_cast<const __half*>(Vs) + vt * 16 + 8 * hh + g;
        constexpr int kRowH = kRow / 2;
        const uint32_t b0 = detail::pack_halves(col[(2 * t) * kRowH], col[(2 * t + 1) * kRowH]);
        const uint32_t b1 =
            detail::pack_halves(col[(2 * t + 8) * kRowH], col[(2 * t + 9) * kRowH]);
        detail::mma_16816(O[vt][hh], pa, b0, b1);
      }
    }
    __syncwarp();
  }
  detail::cp_async_wait<0>();
  detail::store_partial<NT>(part, row_base, gqa, split, st, O, NT);
}

template <int D>
void launch_fp16(int n_kv_heads, const DecodeBatch& batch, const uint16_t* pool,
                 const detail::WorkspaceView& w, int tiles_per_split, int n_heads, int gqa,
                 cudaStream_t stream) {
  const size_t smem = (size_t)detail::kWarpsPerCta * kStages * 2 * 16 * (D * 2 + 16);
  static int smem_set[detail::kMaxDevices] = {};  // one cache per instance
  detail::set_smem_limit(reinterpret_cast<const void*>(fp16_decode_kernel<D>), smem, smem_set);
  dim3 grid((w.part.n_splits + detail::kWarpsPerCta - 1) / detail::kWarpsPerCta, n_kv_heads,
            batch.batch);
  fp16_decode_kernel<D><<<grid, 32 * detail::kWarpsPerCta, smem, stream>>>(
      reinterpret_cast<const __half*>(pool), n_kv_heads, batch.page_table, batch.max_pages,
      batch.seq_lens, batch.window, tiles_per_split, n_heads, gqa, w.q, w.part);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

namespace {
bool use_n8(int gqa, Fp16DecodeVariant variant) {
  return variant == Fp16DecodeVariant::n8 || variant == Fp16DecodeVariant::n8_fused ||
         (variant == Fp16DecodeVariant::automatic && gqa <= 8);
}
}  // namespace

bool fp16_fused_merge(int gqa, int n_splits, Fp16DecodeVariant variant) {
  return variant == Fp16DecodeVariant::n8_fused ||
         (variant == Fp16DecodeVariant::automatic && gqa <= 8 && n_splits <= kFp16FusedMaxSplits);
}

int fp16_default_splits(int batch, int n_kv_heads, int n_heads, int head_dim, int max_seq_len,
                        Fp16DecodeVariant variant) {
  const int gqa = n_kv_heads > 0 ? n_heads / n_kv_heads : 1;
  if (!use_n8(gqa, variant)) return default_splits(batch, n_kv_heads, max_seq_len);
  const int sms = detail::sm_count();
  const int rows = std::max(1, batch * n_kv_heads);
  const int tiles = (max_seq_len + 15) / 16;
  const int wave = std::max(1, sms * detail::fp16_n8_warps_per_sm(head_dim) / rows);
  int want = std::max(1, std::min(wave, tiles / 2));
  if (want >= 4) want = want / 4 * 4;  // whole CTAs of 4 warps
  // Past one wave (rows > SMs · warps / 4: large batches) the wave bound gives
  // 1..3 splits, and a CTA of 4 warps with 1..3 splits leaves the rest of its
  // warps (and their shared memory) idle: give each of its 4 warps a split
  // of ≥ 2 tiles instead (more, shorter chains; merged in the kernel).
  if (want < 4) want = std::max(want, std::min(4, tiles / 2));
  return want;
}

void fp16_decode_attention(int n_heads, int n_kv_heads, int head_dim, const DecodeBatch& batch,
                           const uint16_t* pool, const void* q, DType q_dtype, float scale,
                           float* out, void* workspace, size_t workspace_bytes, int n_splits,
                           void* stream_, Fp16DecodeVariant variant) {
  detail::check_batch(batch, "fp16_decode_attention");
  detail::require(pool && q && out, "fp16_decode_attention: pool, q and out must be device pointers");
  detail::require(n_kv_heads > 0 && n_heads > 0 && n_heads % n_kv_heads == 0,
                  "fp16_decode_attention: n_heads ", n_heads, " is not a multiple of n_kv_heads ",
                  n_kv_heads);
  const int gqa = n_heads / n_kv_heads;
  detail::require(gqa <= 16, "fp16_decode_attention: GQA ", gqa, " > 16 unsupported");
  detail::require((variant != Fp16DecodeVariant::n8 && variant != Fp16DecodeVariant::n8_fused) || gqa <= 8,
                  "fp16_decode_attention: the n8 kernel needs GQA <= 8, got ", gqa);
  auto stream = static_cast<cudaStream_t>(stream_);
  const int span = detail::decode_span(batch, 16);  // max_seq_len, or the window's tiles
  if (n_splits <= 0) n_splits = fp16_default_splits(batch.batch, n_kv_heads, n_heads, head_dim, span, variant);
  const int n_tiles = (span + 15) / 16;
  const int tps = (n_tiles + n_splits - 1) / n_splits;
  const detail::WorkspaceView w =
      detail::carve_workspace(workspace, workspace_bytes, batch.batch, n_heads, head_dim, n_splits);
  switch (head_dim) {
    case 64:
    case 128:
    case 256: break;
    default:
      detail::throw_error(detail::cat("fp16_decode_attention: head_dim ", head_dim,
                                      " has no kernel (64, 128, 256)"));
  }
  const bool fused = fp16_fused_merge(gqa, n_splits, variant);
  detail::launch_rotate_query(q, q_dtype == DType::f16, batch.batch, n_heads, head_dim, gqa, scale,
                              nullptr, nullptr, nullptr, head_dim, w.q, stream, fused ? w.counters : nullptr);
  if (use_n8(gqa, variant)) {
    detail::launch_fp16_n8(n_kv_heads, head_dim, batch, pool, w, tps, n_heads, gqa, stream,
                           fused ? out : nullptr);
    if (!fused)
      detail::launch_splitk_lse_merge(w, batch.batch, n_heads, gqa, head_dim, nullptr, nullptr, nullptr, out,
                                      stream);
    return;
  }
  switch (head_dim) {
    case 64: launch_fp16<64>(n_kv_heads, batch, pool, w, tps, n_heads, gqa, stream); break;
    case 128: launch_fp16<128>(n_kv_heads, batch, pool, w, tps, n_heads, gqa, stream); break;
    case 256: launch_fp16<256>(n_kv_heads, batch, pool, w, tps, n_heads, gqa, stream); break;
  }
  detail::launch_splitk_lse_merge(w, batch.batch, n_heads, gqa, head_dim, nullptr, nullptr, nullptr,
                                  out, stream);
}

}  // namespace ratekv::cuda
