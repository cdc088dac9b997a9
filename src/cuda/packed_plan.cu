// PackedPlan (host tables -> device), the decode workspace, the query-rotation
// prologue and the split-K log-sum-exp merge + back-rotation epilogue.
#include <cmath>
#include <cstring>

#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

using detail::HeadTables;
using packed::Side;

namespace {
constexpr int kRotDim = detail::kMaxTiles * 16;  // row stride of rotated q / partial o
}  // namespace

namespace detail {

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
  w.part.n_splits = n_splits;
  w.part.o_dim = kRotDim;
  return w;
}

namespace {

// out[j] = fp16(scale · Σ_i Π_g[j][i] q[ch_i]) per key group (tables), or
// fp16(scale · q[j]) (no tables). One block per (batch, query head).
template <typename TQ>
__global__ void rotate_query_kernel(const TQ* __restrict__ q, int head_dim, int n_heads, int gqa,
                                    float scale,
                                    const HeadTables* __restrict__ tables,
                                    const float* __restrict__ rot,
                                    const int32_t* __restrict__ chans, __half* __restrict__ out) {
  __shared__ float qs[256];
  const int row = blockIdx.x;  // b·n_heads + q_head
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
    qs[i] = (float)q[(size_t)row * head_dim + i];
  __syncthreads();
  __half* o = out + (size_t)row * kRotDim;
  if (!tables) {
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) o[i] = __float2half_rn(scale * qs[i]);
    return;
  }
  const int h = (row % n_heads) / gqa;
  const HeadTables& T = tables[h];
  // One warp per rotated coordinate j, lanes over i: coalesced rows of Π.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  for (int g = 0; g < T.n_groups[0]; ++g) {
    const int dim = T.dim[0][g], dim_pad = T.dim_pad[0][g], base = T.tile_begin[0][g] * 16;
    const float* R = rot + T.rot_offset[0][g];
    const int32_t* ch = chans + T.chan_offset[0][g];
#pragma unroll 8
    for (int j = warp; j < dim_pad; j += n_warps) {
      float acc = 0.f;
      if (j < dim)
        for (int i = lane; i < dim; i += 32) acc = fmaf(R[(size_t)j * dim + i], qs[ch[i]], acc);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (lane == 0) o[base + j] = __float2half_rn(scale * acc);
    }
  }
}

// Log-sum-exp merge of the split states, then back-rotation per value group.
__global__ void merge_kernel(Partials P, int head_dim, int gqa, int n_heads,
                             const HeadTables* __restrict__ tables, const float* __restrict__ rot,
                             const int32_t* __restrict__ chans, float* __restrict__ out) {
  __shared__ float orot[kRotDim];
  __shared__ float wsh[1024];
  __shared__ float inv_l;
  const int row = blockIdx.x;
  const float* m = P.m + (size_t)row * P.n_splits;
  const float* l = P.l + (size_t)row * P.n_splits;
  float M = -INFINITY;
  for (int s = 0; s < P.n_splits; ++s) M = fmaxf(M, m[s]);
  const int n_o = tables ? tables[(row % n_heads) / gqa].n_tiles[1] * 16 : head_dim;
  // Split weights 2^(m_s − M) (0 for empty splits), staged in shared memory.
  for (int s0 = 0; s0 < P.n_splits; s0 += 1024) {
    const int ns = min(1024, P.n_splits - s0);
    __syncthreads();
    for (int s = threadIdx.x; s < ns; s += blockDim.x)
      wsh[s] = m[s0 + s] == -INFINITY ? 0.f : exp2f(m[s0 + s] - M);
    __syncthreads();
    if (threadIdx.x == 0) {
      float L = s0 == 0 ? 0.f : 1.f / inv_l;
      for (int s = 0; s < ns; ++s) L += wsh[s] * l[s0 + s];
      inv_l = 1.f / L;
    }
    for (int c = threadIdx.x; c < n_o; c += blockDim.x) {
      float acc = s0 == 0 ? 0.f : orot[c];
      const float* o = P.o + ((size_t)row * P.n_splits + s0) * P.o_dim + c;
#pragma unroll 8
      for (int s = 0; s < ns; ++s) acc = fmaf(wsh[s], o[(size_t)s * P.o_dim], acc);  // empty splits: w = 0, o = 0
      orot[c] = acc;
    }
  }
  __syncthreads();
  const float il = inv_l;
  float* o = out + (size_t)row * head_dim;
  if (!tables) {
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) o[c] = orot[c] * il;
    return;
  }
  const HeadTables& T = tables[(row % n_heads) / gqa];
  for (int g = 0; g < T.n_groups[1]; ++g) {
    const int dim = T.dim[1][g], base = T.tile_begin[1][g] * 16;
    const float* R = rot + T.rot_offset[1][g];
    const int32_t* ch = chans + T.chan_offset[1][g];
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      float acc = 0.f;
#pragma unroll 32  // many independent loads of Π in flight (cold in L2 at short T)
      for (int j = 0; j < dim; ++j) acc = fmaf(R[(size_t)j * dim + i], orot[base + j], acc);
      o[ch[i]] = acc * il;
    }
  }
}

}  // namespace

void launch_rotate_query(const void* q, bool q_f16, int batch, int n_heads, int head_dim, int gqa,
                         float scale, const HeadTables* tables, const float* rot,
                         const int32_t* chans, __half* out, cudaStream_t stream) {
  const int grid = batch * n_heads;
  if (q_f16)
    rotate_query_kernel<__half><<<grid, 256, 0, stream>>>(
        static_cast<const __half*>(q), head_dim, n_heads, gqa, scale, tables, rot, chans, out);
  else
    rotate_query_kernel<float><<<grid, 256, 0, stream>>>(
        static_cast<const float*>(q), head_dim, n_heads, gqa, scale, tables, rot, chans, out);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

void launch_merge(const WorkspaceView& w, int batch, int n_heads, int gqa, int head_dim,
                  const HeadTables* tables, const float* rotations, const int32_t* channels,
                  float* out, cudaStream_t stream) {
  merge_kernel<<<batch * n_heads, 128, 0, stream>>>(w.part, head_dim, gqa, n_heads, tables,
                                                    rotations, channels, out);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace ratekv::cuda
