// The vq pages' encoder (ratekv/cuda/vq_encode.h, docs/packed_format.md §7):
// TaSQ / CQ indices (nearest codeword per group in the weighted, scaled
// space), shared fp16 scales and fp16 rows written for decode append and
// prefill. Reference: cache::encode_vq_token (include/ratekv/cache/
// vq_page_codec.h); the arithmetic of each index matches it operation for
// operation (IEEE-rounded intrinsics; the distance as fma(e, e, Σ), as
// VqCodec::encode writes it).
//
// Grid (n_tokens, batch), 256 threads: one CTA per token, both sides one after
// the other. Per vq side: the shared scale (double tree reduction over the
// H·d weighted squares), y = (a·x)·(1/s) into shared memory in group order,
// then one warp per (KV head, group): the lanes scan codewords j ≡ lane (mod
// 32) in ascending order with a strict <, and a warp reduction keeps the
// smallest distance, ties to the lowest j — the reference's first minimum.
// Lane 0 writes the index into the bit stream with atomicAnd / atomicOr on
// the (one or two) 32-bit words it touches.
#include <climits>

#include "attention_common.cuh"
#include "ratekv/cuda/vq_encode.h"
#include "vq_encode_tables.h"

namespace ratekv::cuda {

namespace {

using detail::VqEncodeTables;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ void write_index(uint8_t* seg, int n_groups, int bits, int slot, int gi, uint32_t z) {
  const uint64_t p0 = ((uint64_t)slot * n_groups + gi) * bits;
  uint32_t* w = reinterpret_cast<uint32_t*>(seg) + (p0 >> 5);
  const int sh = (int)(p0 & 31);
  const uint64_t m = (((uint64_t)1 << bits) - 1) << sh, v = (uint64_t)z << sh;
  atomicAnd(w, ~(uint32_t)m);
  atomicOr(w, (uint32_t)v);
  if (sh + bits > 32) {
    atomicAnd(w + 1, ~(uint32_t)(m >> 32));
    atomicOr(w + 1, (uint32_t)(v >> 32));
  }
}

__global__ void __launch_bounds__(kThreads) vq_encode_kernel(const VqEncodeTables T, uint8_t* __restrict__ pool,
                                                             const int32_t* __restrict__ page_table, int max_pages,
                                                             const int32_t* __restrict__ seq_lens,
                                                             const float* __restrict__ k_pre,
                                                             const float* __restrict__ k,
                                                             const float* __restrict__ v, int n_tokens) {
  extern __shared__ float ys[];  // (H, d): y in group order per head
  __shared__ double red[kWarps];
  __shared__ float s_sh;
  const int i = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int d = T.head_dim, H = T.n_kv_heads, row = H * d;
  const int pos = seq_lens[b] + i;
  const int slot = pos % packed::kPageTokens;
  uint8_t* page = pool + (size_t)page_table[(size_t)b * max_pages + pos / packed::kPageTokens] * T.page_bytes;
  const size_t at = ((size_t)b * n_tokens + i) * row;
  for (int s = 0; s < 2; ++s) {
    if (T.kind[s] == 0) continue;
    const float* x = (s == 1 ? v : T.kind[0] == 1 ? k_pre : k) + at;
    if (T.kind[s] == 2) {  // fp16 rows
      for (int e = tid; e < row; e += kThreads) {
        const int h = e / d, c = e % d;
        const __half hv = __float2half_rn(x[e]);
        *reinterpret_cast<__half*>(page + h * T.head_bytes + T.seg_offset[s] + ((size_t)slot * d + c) * 2) = hv;
      }
      continue;
    }
    const float* a = T.channel_scale + (size_t)s * d;  // + h·2·d per head
    const int32_t* chs = T.channels + (size_t)s * d;
    // Shared scale: Σ_h Σ_c ((double)a_c · x_c)², rms = sqrt(Σ / (H·d)), fp16.
    if (T.shared[s]) {
      double acc = 0.0;
      for (int e = tid; e < row; e += kThreads) {
        const int h = e / d, c = e % d;
        const double y = __dmul_rn((double)a[(size_t)h * 2 * d + c], (double)x[e]);
        acc = __dadd_rn(acc, __dmul_rn(y, y));
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc = __dadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
      if (lane == 0) red[warp] = acc;
      __syncthreads();
      if (tid == 0) {
        double sum = 0.0;
        for (int w = 0; w < kWarps; ++w) sum = __dadd_rn(sum, red[w]);
        const double rms = sqrt(__ddiv_rn(sum, (double)H * (double)d));
        float sc;
        if (!(isfinite(rms) && rms <= 65504.0)) {
          atomicOr(T.status, 1);
          sc = 65504.0f;
        } else {
          sc = __half2float(__float2half_rn(__double2float_rn(rms)));
          if (!(sc > 0.0f)) sc = __half2float(__ushort_as_half((unsigned short)1));  // smallest subnormal
        }
        s_sh = sc;
        *reinterpret_cast<__half*>(page + T.scale_offset[s] + 2 * slot) = __float2half_rn(sc);
      }
      __syncthreads();
    } else if (tid == 0) {
      s_sh = 1.0f;
    }
    __syncthreads();
    const float inv = __fdiv_rn(1.0f, s_sh);
    for (int e = tid; e < row; e += kThreads) {  // e = h·d + (gi·g + j): the group-order coordinate
      const int h = e / d, j = e % d;
      const int c = chs[(size_t)h * 2 * d + j];
      ys[e] = __fmul_rn(__fmul_rn(a[(size_t)h * 2 * d + c], x[(size_t)h * d + c]), inv);
    }
    __syncthreads();
    const int G = T.n_groups[s], g = T.group_size[s], K = 1 << T.bits[s];
    for (int p = warp; p < H * G; p += kWarps) {
      const int h = p / G, gi = p % G;
      const float* y = ys + (size_t)h * d + (size_t)gi * g;
      const float* cb = T.codebooks + T.cb_offset[h * 2 + s] + (size_t)gi * K * g;
      float best = INFINITY;
      int arg = INT_MAX;
      for (int j = lane; j < K; j += 32) {
        const float* c = cb + (size_t)j * g;
        float dist = 0.0f;
        for (int q = 0; q < g; ++q) {
          const float e = __fsub_rn(y[q], c[q]);
          dist = __fmaf_rn(e, e, dist);
        }
        if (dist < best) {
          best = dist;
          arg = j;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
        if (ob < best || (ob == best && oa < arg)) {
          best = ob;
          arg = oa;
        }
      }
      if (lane == 0)
        write_index(page + h * T.head_bytes + T.seg_offset[s], G, T.bits[s], slot, gi,
                    arg == INT_MAX ? 0u : (uint32_t)arg);
    }
    __syncthreads();  // ys reused by the next side
  }
}

}  // namespace

void vq_append(const VqEncodePlan& plan, const DecodeBatch& batch, uint8_t* pool, const float* k_pre,
               const float* k, const float* v, int n_tokens, void* stream) {
  const VqEncodeTables& T = plan.device().t;
  detail::require(batch.batch > 0, "vq_append: batch ", batch.batch, " must be positive");
  detail::require(n_tokens >= 1, "vq_append: n_tokens ", n_tokens, " must be at least 1");
  detail::require(batch.page_table && batch.seq_lens && pool,
                  "vq_append: page_table, seq_lens and pool must be device pointers");
  detail::require(T.kind[0] == 0 || (T.kind[0] == 1 ? k_pre : k) != nullptr,
                  "vq_append: the key side is in the vq pages: ", T.kind[0] == 1 ? "k_pre" : "k",
                  " must be a device pointer");
  detail::require(T.kind[1] == 0 || v != nullptr, "vq_append: the value side is in the vq pages: v must be a device pointer");
  if (T.kind[0] == 0 && T.kind[1] == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  const size_t smem = (size_t)T.n_kv_heads * T.head_dim * sizeof(float);
  const dim3 grid(n_tokens, batch.batch);
  vq_encode_kernel<<<grid, kThreads, smem, st>>>(T, pool, batch.page_table, batch.max_pages, batch.seq_lens, k_pre,
                                                 k, v, n_tokens);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ratekv::cuda
