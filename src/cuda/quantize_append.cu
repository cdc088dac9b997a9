// Quantize-append of one decode token per sequence into the packed cache
// (TurboQuant-MSE, docs/design.md §2; bit placement: docs/packed_format.md).
// Grid (batch, n_kv_heads, 2 sides), 256 threads; the groups of a side one
// after another, all 8 warps on each (one row of Π_g per warp at a time).
#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

using detail::HeadTables;

namespace {

template <typename TX>
__global__ void __launch_bounds__(256) append_kernel(
    const HeadTables* __restrict__ tables, const float* __restrict__ rot,
    const int32_t* __restrict__ chans, const float* __restrict__ levels, uint8_t* __restrict__ pool,
    size_t page_bytes, const int32_t* __restrict__ page_table, int max_pages,
    const int32_t* __restrict__ seq_lens, const TX* __restrict__ k, const TX* __restrict__ v,
    int head_dim) {
  __shared__ float xw[256];   // the group's gathered channels
  __shared__ float ys[256];   // Π_g x_g (unnormalized)
  __shared__ float red[8];
  const int b = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const HeadTables& T = tables[h];
  const TX* x = (s == 0 ? k : v) + ((size_t)b * gridDim.y + h) * head_dim;
  const int pos = seq_lens[b];
  const int slot = pos % packed::kPageTokens, r = slot % 16, tt = slot / 16;
  uint8_t* base = pool + (size_t)page_table[(size_t)b * max_pages + pos / packed::kPageTokens] *
                             page_bytes +
                  T.block_offset;
  for (int g = 0; g < T.n_groups[s]; ++g) {
    const int dim = T.dim[s][g], dim_pad = T.dim_pad[s][g], bits = T.bits[s][g];
    const float* R = rot + T.rot_offset[s][g];
    const int32_t* ch = chans + T.chan_offset[s][g];
    const float* lv = levels + T.lvl_offset[s][g];
    __syncthreads();  // previous group done with xw, ys, red
    float ss = 0.f;
    if (tid < dim) {
      const float xi = (float)x[ch[tid]];
      xw[tid] = xi;
      ss = xi * xi;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) tot += red[w];
    const float n = sqrtf(tot);
    const float inv = n > 0.f ? 1.f / n : 0.f;
    // y_j: one warp per row j of Π_g, lanes over i (coalesced).
    for (int j = warp; j < dim; j += 8) {
      float acc = 0.f;
      for (int i = lane; i < dim; i += 32) acc = fmaf(R[(size_t)j * dim + i], xw[i], acc);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if (lane == 0) ys[j] = acc;
    }
    __syncthreads();
    if (tid < dim_pad) {
      const int j = tid;
      uint32_t code = 0;
      if (j < dim) {
        const float y = ys[j] * inv;
        for (int l = 0; l + 1 < (1 << bits); ++l) code += y > 0.5f * (lv[l] + lv[l + 1]) ? 1u : 0u;
      }
      // element (token r, channel c) of tile (tt, ct): lane and fragment element
      // as documented (values transposed); bit p of the code at
      // packed::code_bit_pos(bits, tt, e, p) of that lane's words of tile ct.
      const int c = j % 16, ct = j / 16;
      const int rr = s == 0 ? r : c, cc = s == 0 ? c : r;
      const int elane = 4 * (rr % 8) + (cc % 8) / 2, e = 4 * (rr / 8) + 2 * (cc / 8) + cc % 2;
      for (int p = 0; p < bits; ++p) {
        const packed::CodeBitPos at = packed::code_bit_pos(bits, tt, e, p);
        uint32_t* word = reinterpret_cast<uint32_t*>(
            base + (size_t)T.code_offset[s][g] +
            ((size_t)(ct * bits + at.word) * packed::kWarpLanes + elane) * 4);
        const uint32_t mask = 1u << at.bit;
        if ((code >> p) & 1u)
          atomicOr(word, mask);
        else
          atomicAnd(word, ~mask);
      }
    }
    if (tid == 0) {
      __half hn = __float2half_rn(n);
      *reinterpret_cast<__half*>(base + T.norm_offset[s][g] + 2 * slot) = hn;
    }
  }
}

}  // namespace

void packed_append(const PackedPlan& plan, const DecodeBatch& batch, uint8_t* pool, const void* k,
                   const void* v, DType dtype, void* stream_) {
  detail::check_batch(batch, "packed_append");
  detail::require(pool && k && v, "packed_append: pool, k and v must be device pointers");
  detail::require(!plan.device().has_wide, "packed_append: the plan has 5..8-bit groups (extension "
                  "pages); the GPU quantizers do not write them (the CPU packed cache does)");
  const int d = plan.head_dim();
  detail::require(d <= 256, "packed_append: head_dim ", d, " > 256 unsupported");
  auto stream = static_cast<cudaStream_t>(stream_);
  const auto& D = plan.device();
  dim3 grid(batch.batch, plan.layout().n_kv_heads(), 2);
  switch (dtype) {
    case DType::f32:
      append_kernel<float><<<grid, 256, 0, stream>>>(
          D.heads, D.rotations, D.channels, D.levels, pool, plan.layout().page_bytes(),
          batch.page_table, batch.max_pages, batch.seq_lens, static_cast<const float*>(k),
          static_cast<const float*>(v), d);
      break;
    case DType::f16:
      append_kernel<__half><<<grid, 256, 0, stream>>>(
          D.heads, D.rotations, D.channels, D.levels, pool, plan.layout().page_bytes(),
          batch.page_table, batch.max_pages, batch.seq_lens, static_cast<const __half*>(k),
          static_cast<const __half*>(v), d);
      break;
    default: detail::throw_error(detail::cat("packed_append: unsupported input dtype ", (int)dtype));
  }
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ratekv::cuda
