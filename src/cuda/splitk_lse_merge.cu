// The split-K epilogue of every decode kernel (packed, generic, vq, fp16):
// the log-sum-exp merge of the per-split partial states {m, l, o}
// (detail::Partials, written by the attention kernels) into one output row,
// with the back-rotation Π_gᵀ of each value group of the packed plans:
//   M = max_s m_s,  w_s = 2^(m_s − M),  L = Σ_s w_s l_s,
//   o_rot = Σ_s w_s o_s / L,  out[ch_g] = Π_gᵀ o_rot[g]   (no tables: out = o_rot).
// Scores are in log2 units (the kernels fold log2 e into the scale). The CPU
// reference of the whole decode (kernel + this merge) is
// ref::packed_decode_attention / vq / fp16 (include/ratekv/ref/).
#include <cmath>

#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda::detail {

namespace {

constexpr int kRotDim = kMaxTiles * 16;  // row stride of partial o

// Log-sum-exp merge of the split states, then back-rotation per value group.
// One block per (batch, query head) row, kMergeThreads threads: the splits are
// dealt to kMergeQ = 8 thread groups (each with 8 loads in flight per thread)
// and summed in shared memory, so a row with hundreds of splits (B = 1, long T)
// is not one long chain of dependent loads; likewise the back-rotation sums
// eighths of Π's rows. The value-side Π of the row's KV head (when it fits in
// kPiSmemFloats) and the first 1024 split states are loaded up front, all in
// flight together, so the kernel waits on memory about twice (states + Π,
// then the partial outputs) instead of four times. kWide (batches of more
// query rows than SMs): Π goes to shared memory by cp.async (no registers
// hold it on the way), waited for only before the back-rotation, and the
// kernel fits 32 registers (12 bytes spilled, outside the loops) so two
// blocks share an SM (85 KB of shared memory each; the largest carveout is
// asked for) — the other instance uses 56, one block per SM: 256 rows took
// two waves. Not for few rows: at Qwen2.5-3B B = 1 (16 rows of 132
// states) the 32-register instance was up to 10.7 % slower (H200, session 15).
constexpr int kMergeQ = 8;
constexpr int kMergeThreads = 128 * kMergeQ;
constexpr int kPiSmemFloats = 16384;  // 64 KB: one 128×128 group (uniform d ≤ 128)
constexpr int kPiPerThread = kPiSmemFloats / kMergeThreads;
// Minimum blocks per SM 0 for the one-block instance: none asked for, so it
// compiles as before the wide instance existed (56 registers; 1 gave 64).
template <bool kWide>
__global__ void __launch_bounds__(kMergeThreads, kWide ? 2 : 0) splitk_lse_merge_kernel(
    Partials P, int head_dim, int gqa, int n_heads, const HeadTables* __restrict__ tables,
    const float* __restrict__ rot, const int32_t* __restrict__ chans, float* __restrict__ out) {
  extern __shared__ float pis[];  // value-side Π of this KV head (dynamic, when it fits)
  __shared__ float orot[kRotDim];
  __shared__ float part[kMergeQ][kRotDim];
  __shared__ float wsh[1024], lsh[1024];
  __shared__ float red[kMergeThreads / 32];
  __shared__ float M_sh, L_sh;
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q = tid / 128, c0 = tid % 128;
  const float* m = P.m + (size_t)row * P.n_splits;
  const float* l = P.l + (size_t)row * P.n_splits;
  const HeadTables* Tp = tables ? tables + (row % n_heads) / gqa : nullptr;
  // Value groups of a head are consecutive in the rotations array (packed_plan.cpp).
  int pi_total = 0, covered = 0;  // Π floats and output channels of the value groups
  if (Tp)
    for (int g = 0; g < Tp->n_groups[1]; ++g) {
      pi_total += Tp->dim[1][g] * Tp->dim[1][g];
      covered += Tp->dim[1][g];
    }
  const bool pi_smem = Tp && pi_total <= kPiSmemFloats;
  float pv[kWide ? 1 : kPiPerThread];
  if (pi_smem) {
    const float* src = rot + Tp->rot_offset[1][0];
#pragma unroll
    for (int k = 0; k < kPiPerThread; ++k) {
      const int idx = tid + k * kMergeThreads;
      if constexpr (kWide) {
        if (idx < pi_total) cp_async4(pis + idx, src + idx);
      } else {
        pv[k] = idx < pi_total ? src[idx] : 0.f;
      }
    }
  }
  if constexpr (kWide) cp_async_commit();
  grid_dependency_wait();  // split states come from the attention kernel (PDL launch)
  // M = max_s m_s (block reduction); the first 1024 states kept in shared memory.
  float mx = -INFINITY;
  for (int s = tid; s < P.n_splits; s += kMergeThreads) {
    const float v = m[s];
    if (s < 1024) {
      wsh[s] = v;
      lsh[s] = l[s];
    }
    mx = fmaxf(mx, v);
  }
  if (!kWide && pi_smem) {
#pragma unroll
    for (int k = 0; k < kPiPerThread; ++k) {
      const int idx = tid + k * kMergeThreads;
      if (idx < pi_total) pis[idx] = pv[k];
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  if (tid == 0) {
    float v = red[0];
    for (int w = 1; w < kMergeThreads / 32; ++w) v = fmaxf(v, red[w]);
    M_sh = v;
    L_sh = 0.f;
  }
  __syncthreads();
  const float M = M_sh;
  const int n_o = Tp ? Tp->n_tiles[1] * 16 : head_dim;
  float acc[(kRotDim + 127) / 128];
#pragma unroll
  for (int k = 0; k < (kRotDim + 127) / 128; ++k) acc[k] = 0.f;
  for (int s0 = 0; s0 < P.n_splits; s0 += 1024) {
    const int ns = min(1024, P.n_splits - s0);
    __syncthreads();  // previous chunk's weights consumed
    float ls = 0.f;
    for (int s = tid; s < ns; s += kMergeThreads) {
      const float ms = s0 == 0 ? wsh[s] : m[s0 + s];
      const float ll = s0 == 0 ? lsh[s] : l[s0 + s];
      const float w = ms == -INFINITY ? 0.f : exp2f(ms - M);  // empty splits weigh 0
      wsh[s] = w;
      ls += w * ll;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ls += __shfl_xor_sync(0xffffffffu, ls, o);
    if (lane == 0) atomicAdd(&L_sh, ls);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < (kRotDim + 127) / 128; ++k) {
      const int c = c0 + 128 * k;
      if (c >= n_o) break;
      const float* o = P.o + ((size_t)row * P.n_splits + s0) * P.o_dim + c;
      float a = acc[k];
#pragma unroll 8
      for (int s = q; s < ns; s += kMergeQ) a = fmaf(wsh[s], o[(size_t)s * P.o_dim], a);  // empty: w = 0, o = 0
      acc[k] = a;
    }
  }
#pragma unroll
  for (int k = 0; k < (kRotDim + 127) / 128; ++k) {
    const int c = c0 + 128 * k;
    if (c < n_o) part[q][c] = acc[k];
  }
  if constexpr (kWide) cp_async_wait<0>();  // this thread's share of Π; the barrier publishes all of it
  __syncthreads();
  for (int c = tid; c < n_o; c += kMergeThreads) {
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < kMergeQ; ++k) a += part[k][c];
    orot[c] = a;
  }
  __syncthreads();
  const float il = 1.f / L_sh;
  float* o = out + (size_t)row * head_dim;
  if (!Tp) {
    for (int c = tid; c < head_dim; c += kMergeThreads) o[c] = orot[c] * il;
    return;
  }
  const HeadTables& T = *Tp;
  // Output channels in no value group (0-bit channels, or a value side with
  // no groups at all) are 0, as in the CPU packed cache; written before the
  // covered ones (the barrier orders the two writes of a channel).
  if (covered < head_dim) {
    for (int c = tid; c < head_dim; c += kMergeThreads) o[c] = 0.f;
    __syncthreads();
  }
  for (int g = 0; g < T.n_groups[1]; ++g) {
    const int dim = T.dim[1][g], base = T.tile_begin[1][g] * 16;
    const float* R = pi_smem ? pis + (T.rot_offset[1][g] - T.rot_offset[1][0]) : rot + T.rot_offset[1][g];
    const int32_t* ch = chans + T.chan_offset[1][g];
    // Slice q of Π's rows j, threads over output channels i (coalesced rows).
    const int j_lo = (dim * q) / kMergeQ, j_hi = (dim * (q + 1)) / kMergeQ;
    for (int i0 = 0; i0 < dim; i0 += 128) {
      const int i = i0 + c0;
      float a = 0.f;
      if (i < dim) {
#pragma unroll 16
        for (int j = j_lo; j < j_hi; ++j) a = fmaf(R[(size_t)j * dim + i], orot[base + j], a);
      }
      __syncthreads();  // part[] free (previous i0 / group done)
      part[q][c0] = a;
      __syncthreads();
      if (q == 0 && i < dim) {
        float sum = 0.f;
#pragma unroll
        for (int k = 0; k < kMergeQ; ++k) sum += part[k][c0];
        o[ch[i]] = sum * il;
      }
    }
  }
}

}  // namespace

void launch_splitk_lse_merge(const WorkspaceView& w, int batch, int n_heads, int gqa, int head_dim,
                             const HeadTables* tables, const float* rotations, const int32_t* channels,
                             float* out, cudaStream_t stream) {
  const size_t dyn = tables ? kPiSmemFloats * sizeof(float) : 0;
  const int rows = batch * n_heads;
  auto launch = [&](auto kernel, int (&smem_set)[kMaxDevices], bool wide) {
    if (dyn > 0) set_smem_limit(reinterpret_cast<const void*>(kernel), dyn, smem_set, wide);
    // Programmatic dependent launch: loading Π overlaps the attention kernel's tail.
    launch_pdl(kernel, dim3(rows), dim3(kMergeThreads), dyn, stream, w.part, head_dim, gqa, n_heads, tables,
               rotations, channels, out);
  };
  static int smem_set_wide[kMaxDevices] = {}, smem_set_narrow[kMaxDevices] = {};
  if (rows > sm_count())
    launch(splitk_lse_merge_kernel<true>, smem_set_wide, true);
  else
    launch(splitk_lse_merge_kernel<false>, smem_set_narrow, false);
}

}  // namespace ratekv::cuda::detail
