// vq_dequantize (ratekv/cuda/vq_encode.h): the vq pages' keys (RoPE at their
// positions) and values as fp16 rows, for the engine's evaluation-mode and
// chunked prefill attention. Grid (n_tokens, n_kv_heads), 128 threads: the
// head's row decoded into shared memory (one thread per group: s · C̃[z] on
// the group's channels), keys rotated (one thread per RoPE block), written
// as fp16. Same decoding and RoPE as vq_decode_attention (decode_side).
#include "attention_common.cuh"
#include "ratekv/cuda/vq_encode.h"
#include "vq_tables.h"

namespace ratekv::cuda {

namespace {

using detail::VqTables;

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) vq_dequantize_kernel(const VqTables T, const uint8_t* __restrict__ pool,
                                                                 const int32_t* __restrict__ page_table, int pos0,
                                                                 uint16_t* __restrict__ k16,
                                                                 uint16_t* __restrict__ v16) {
  __shared__ float xs[detail::kVqMaxHeadDim];
  const int i = blockIdx.x, h = blockIdx.y, Hkv = gridDim.y, tid = threadIdx.x, d = T.head_dim;
  const int slot = i % packed::kPageTokens;
  const uint8_t* page = pool + (size_t)page_table[i / packed::kPageTokens] * T.page_bytes;
  for (int s = 0; s < 2; ++s) {
    if (T.kind[s] == 0) continue;  // scalar values: not in the vq pages
    uint16_t* out = (s == 0 ? k16 : v16) + ((size_t)i * Hkv + h) * d;
    const uint8_t* seg = page + h * T.head_bytes + T.seg_offset[s];
    if (T.kind[s] == detail::kVqKindFp16) {
      const uint16_t* row = reinterpret_cast<const uint16_t*>(seg + (size_t)slot * d * 2);
      for (int c = tid; c < d; c += kThreads) out[c] = row[c];
      continue;
    }
    const int G = T.n_groups[s], g = T.group_size[s], bits = T.bits[s];
    const float sc =
        T.shared[s] ? __half2float(*reinterpret_cast<const __half*>(page + T.scale_offset[s] + 2 * slot)) : 1.f;
    const float* cw = T.codewords + T.cw_offset[h * 2 + s];
    const int32_t* ch = T.channels + T.ch_offset[h * 2 + s];
    __syncthreads();  // xs free
    for (int gi = tid; gi < G; gi += kThreads) {
      const uint32_t p0 = ((uint32_t)slot * G + gi) * bits;
      const uint8_t* b = seg + (p0 >> 3);
      const int sh = p0 & 7, nb = (sh + bits + 7) >> 3;
      uint32_t w = 0;
      for (int q = 0; q < nb; ++q) w |= (uint32_t)b[q] << (8 * q);
      const uint32_t z = (w >> sh) & ((1u << bits) - 1u);
      const float* c = cw + ((size_t)gi * ((size_t)1 << bits) + z) * g;
      for (int j = 0; j < g; ++j) xs[ch[(size_t)gi * g + j]] = sc * c[j];
    }
    __syncthreads();
    if (s == 0) {  // vq keys are pre-RoPE: rotate at the token's position
      const int half = d / 2, step = T.neox ? 1 : 2, off = T.neox ? half : 1;
      for (int blk = tid; blk < half; blk += kThreads) {
        double sn, cs;
        sincos((double)(pos0 + i) * T.freq[blk], &sn, &cs);
        const float c = (float)cs, sv = (float)sn;
        const float a = xs[blk * step], bb = xs[blk * step + off];
        xs[blk * step] = a * c - bb * sv;
        xs[blk * step + off] = a * sv + bb * c;
      }
      __syncthreads();
    }
    for (int c = tid; c < d; c += kThreads) out[c] = __half_as_ushort(__float2half_rn(xs[c]));
  }
}

}  // namespace

void vq_dequantize(const VqPlan& plan, const uint8_t* pool, const int32_t* page_table, int n_tokens, int pos0,
                   uint16_t* k16, uint16_t* v16, void* stream) {
  const VqTables& T = plan.device().t;
  detail::require(n_tokens >= 1, "vq_dequantize: n_tokens ", n_tokens, " must be at least 1");
  detail::require(pos0 >= 0, "vq_dequantize: pos0 ", pos0, " must be ≥ 0");
  detail::require(pool && page_table, "vq_dequantize: pool and page_table must be device pointers");
  detail::require(T.kind[0] == 0 || k16, "vq_dequantize: the key side is in the vq pages: k16 must be a device pointer");
  detail::require(T.kind[1] == 0 || v16,
                  "vq_dequantize: the value side is in the vq pages: v16 must be a device pointer");
  const dim3 grid(n_tokens, plan.n_kv_heads());
  vq_dequantize_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(T, pool, page_table, pos0, k16, v16);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ratekv::cuda
