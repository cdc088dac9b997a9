// The decode kernels' shared host helpers and prologue (declared in
// attention_common.cuh): the workspace carve-up, the per-device shared-memory
// limit, and the query rotation (scale · Π_g q_g in fp16, one launch before
// every decode kernel). The epilogue, the split-K log-sum-exp merge with the
// back-rotation, is splitk_lse_merge.cu; PackedPlan's host tables are
// packed_plan.cpp.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

using detail::HeadTables;
using packed::Side;

namespace {
constexpr int kRotDim = detail::kMaxTiles * 16;  // row stride of rotated q / partial o
}  // namespace

namespace detail {

void set_smem_limit(const void* kernel, size_t bytes, int (&cache)[kMaxDevices], bool max_carveout) {
  int dev = 0;
  RATEKV_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < kMaxDevices;
  if (cached && cache[dev] >= (int)bytes) return;
  RATEKV_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  if (max_carveout)
    RATEKV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           (int)cudaSharedmemCarveoutMaxShared));
  if (cached) cache[dev] = (int)bytes;
}

WorkspaceView carve_workspace(void* ws, size_t ws_bytes, int batch, int n_heads, int head_dim,
                              int n_splits) {
  const size_t need = decode_workspace_bytes(batch, n_heads, head_dim, n_splits);
  require(ws != nullptr && ws_bytes >= need, "cuda decode attention: workspace of ", ws_bytes,
          " bytes, ", need, " needed (decode_workspace_bytes)");
  const size_t rows = (size_t)batch * n_heads;
  char* p = static_cast<char*>(ws);
  WorkspaceView w;
  w.q = reinterpret_cast<__half*>(p);
  p += rows * kRotDim * sizeof(__half);
  w.part.o = reinterpret_cast<float*>(p);
  p += rows * n_splits * kRotDim * sizeof(float);
  w.part.m = reinterpret_cast<float*>(p);
  p += rows * n_splits * sizeof(float);
  w.part.l = reinterpret_cast<float*>(p);
  p += rows * n_splits * sizeof(float);
  w.counters = reinterpret_cast<int*>(p);
  w.part.n_splits = n_splits;
  w.part.o_dim = kRotDim;
  return w;
}

namespace {

// out[r, J] = fp16(scale · Σ_i Π_g[j][i] q_r[ch_i]) (J = rotated coordinate j of
// key group g, tables), or fp16(scale · q_r[J]) (no tables), for the gqa query
// rows r of one KV head. Grid (batch · n_kv_heads, ⌈⌈n_cols / 8⌉ / cpw⌉ (≥ 1)):
// one warp per rotated coordinate — cpw of them one after another, so that a
// large batch takes one wave when it can — lanes over i (a coalesced row of Π_g, every load of
// it in flight at once), the KV head's query rows sharing each row of Π_g. The
// whole rotation is about one round trip to memory per coordinate: at B = 1
// the old one-block-per-query-row version walked 16 rows per warp one after
// another (15 µs cold, docs/cuda_results.md). kMaxGqa ≥ gqa and kChunks · 32 ≥
// head_dim size the per-thread arrays: the instance for GQA ≤ 8, head_dim ≤
// 128 fits 32 registers, so 8 blocks share an SM (one instance for all used
// 48 registers, 5 blocks: Llama-3.1-8B at B = 8 took two waves).
template <int kMaxGqa, int kChunks>
constexpr int kRotateBlocksPerSm = (kMaxGqa <= 8 && kChunks <= 4) ? 8 : 4;  // 256 threads each
template <typename TQ, int kMaxGqa, int kChunks>
__global__ void __launch_bounds__(256, kRotateBlocksPerSm<kMaxGqa, kChunks>) rotate_query_kernel(
    const TQ* __restrict__ q, int head_dim, int n_heads, int gqa, float scale,
    const HeadTables* __restrict__ tables, const float* __restrict__ rot,
    const int32_t* __restrict__ chans, int cpw, __half* __restrict__ out, int* __restrict__ zero) {
  __shared__ float qs[kMaxGqa][kChunks * 32];
  allow_dependent_launch();  // the attention kernel's prologue may overlap this one
  if (zero && blockIdx.y == 0 && threadIdx.x == 0) zero[blockIdx.x] = 0;  // arrival counter of (b, KV head)
  const int n_kv = n_heads / gqa;
  const int b = blockIdx.x / n_kv, h = blockIdx.x % n_kv;
  const int row0 = b * n_heads + h * gqa;  // first query row of this KV head
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int J0 = (blockIdx.y * 8 + warp) * cpw;  // this warp's coordinates: [J0, J0 + cpw)
  const int n_out = tables ? tables[h].n_tiles[0] * 16 : head_dim;
  if (blockIdx.y * 8 * cpw >= n_out) return;  // block-uniform
  // Row j of Π_g and its channel indices for coordinate J (0 past the group).
  float rv[kChunks];
  int cv[kChunks];
  int dim = 0;
  auto load = [&](int J) {
    const HeadTables& T = tables[h];
    const int g = T.tile_group[0][J / 16];
    dim = T.dim[0][g];
    const int j = J - T.tile_begin[0][g] * 16;
    const float* Rj = rot + T.rot_offset[0][g] + (size_t)j * dim;
    const int32_t* ch = chans + T.chan_offset[0][g];
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {  // dim ≤ head_dim ≤ 32 · kChunks
      const int i = lane + 32 * k;
      const bool ok = j < dim && i < dim;  // padded coordinates j ≥ dim are written as 0
      rv[k] = ok ? Rj[i] : 0.f;
      cv[k] = ok ? ch[i] : 0;
    }
  };
  // The first coordinate's row is issued before waiting for the query rows
  // (the two memory round trips overlap).
  if (tables && J0 < n_out) load(J0);
  for (int idx = threadIdx.x; idx < gqa * head_dim; idx += blockDim.x)
    qs[idx / head_dim][idx % head_dim] = (float)q[(size_t)row0 * head_dim + idx];
  __syncthreads();
  for (int J = J0; J < J0 + cpw && J < n_out; ++J) {
    if (!tables) {
      if (lane < gqa) out[(size_t)(row0 + lane) * kRotDim + J] = __float2half_rn(scale * qs[lane][J]);
      continue;
    }
    if (J > J0) load(J);
    float acc[kMaxGqa];
#pragma unroll
    for (int r = 0; r < kMaxGqa; ++r) acc[r] = 0.f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (32 * k >= dim) break;  // warp-uniform
#pragma unroll
      for (int r = 0; r < kMaxGqa; ++r)
        if (r < gqa) acc[r] = fmaf(rv[k], qs[r][cv[k]], acc[r]);
    }
#pragma unroll
    for (int r = 0; r < kMaxGqa; ++r) {
      if (r < gqa) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
      }
    }
    // lane r writes row r (acc[r] is the same in every lane after the butterflies)
#pragma unroll
    for (int r = 0; r < kMaxGqa; ++r)
      if (r < gqa && lane == r) out[(size_t)(row0 + r) * kRotDim + J] = __float2half_rn(scale * acc[r]);
  }
}

}  // namespace

void launch_rotate_query(const void* q, bool q_f16, int batch, int n_heads, int head_dim, int gqa,
                         float scale, const HeadTables* tables, const float* rot,
                         const int32_t* chans, int n_cols, __half* out, cudaStream_t stream,
                         int* zero_counters) {
  require(gqa >= 1 && gqa <= 16 && n_heads % gqa == 0 && head_dim <= 256,
          "cuda decode attention: query rotation supports GQA 1..16 and head_dim <= 256 (got GQA ",
          gqa, ", head_dim ", head_dim, ")");
  require(n_cols >= 0 && n_cols <= kRotDim && (tables || n_cols == head_dim),
          "cuda decode attention: query rotation over ", n_cols, " columns (0..", kRotDim,
          ", head_dim ", head_dim, " without tables)");
  // (batch, KV head) × blocks of 8·cpw coordinates, over the written columns
  // only; cpw > 1 only when one coordinate per warp would take more than one
  // wave: the most blocks per (batch, KV head) that fit in one wave (at least
  // 1), then the fewest coordinates per warp that cover the columns in them
  // (the grid stays within one wave whenever kv_rows ≤ wave).
  const bool small = gqa <= 8 && head_dim <= 128;
  const int blocks_per_sm = small ? kRotateBlocksPerSm<8, 4> : kRotateBlocksPerSm<16, 8>;
  const int kv_rows = batch * (n_heads / gqa), octets = std::max(1, (n_cols + 7) / 8);
  require(kv_rows > 0, "cuda decode attention: query rotation of ", kv_rows, " (sequence, KV head) rows (batch ",
          batch, ", n_heads ", n_heads, ")");
  const int64_t wave = (int64_t)sm_count() * blocks_per_sm;
  const int per_row = (int)std::clamp<int64_t>(wave / kv_rows, 1, octets);
  const int cpw = (octets + per_row - 1) / per_row;
  const dim3 grid(kv_rows, (octets + cpw - 1) / cpw);
  auto launch = [&](auto kernel, const auto* qp) {
    kernel<<<grid, 256, 0, stream>>>(qp, head_dim, n_heads, gqa, scale, tables, rot, chans, cpw, out,
                                     zero_counters);
  };
  auto by_shape = [&](const auto* qp) {
    using TQ = std::remove_cv_t<std::remove_pointer_t<decltype(qp)>>;
    if (small)
      launch(rotate_query_kernel<TQ, 8, 4>, qp);
    else
      launch(rotate_query_kernel<TQ, 16, 8>, qp);
  };
  if (q_f16)
    by_shape(static_cast<const __half*>(q));
  else
    by_shape(static_cast<const float*>(q));
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace ratekv::cuda
