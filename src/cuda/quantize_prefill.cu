// Quantize-prefill: a whole prompt's keys and values of one layer into the
// packed cache in one launch (TurboQuant-MSE, docs/design.md §2; bit placement:
// docs/packed_format.md §3).
//
// Grid (pages touched per sequence, n_kv_heads · 2 sides, batch), 256 threads
// (2 CTAs per SM when every group has ≤ 128 channels).
// A CTA owns one (page, KV head, side): for each channel group it stages the
// page's ≤ 64 token vectors (gathered channels, fp32) in shared memory, takes
// their norms, computes Y = X Π_gᵀ with Π_gᵀ staged in 32-row chunks (thread =
// one token × 4·⌈m/16⌉ coordinates, 16-byte broadcast loads of Π), counts the
// Lloyd–Max midpoints below y/n, assembles the page's lane words in shared
// memory and writes them: whole words where the CTA owns all their bits, else
// an atomic clear + set of exactly its tokens' bits (other tokens' bits of a
// page are never touched, as docs/packed_format.md §5 requires).
#include <algorithm>

#include "attention_common.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

using detail::HeadTables;

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 32;        // rows i of Π_gᵀ staged at a time
constexpr int kMaxDim = 256;

/// Shared memory for groups of ≤ kMaxDim channels: xs (token vectors,
/// coordinate-major), pt (a chunk of Π_gᵀ), the page's lane words and their
/// ownership masks (one group), norms, midpoints.
template <int MAXD>
struct PrefillSmem {
  static constexpr int kMaxWords = MAXD / 16 * packed::kMaxBits * packed::kWarpLanes;
  float xs[MAXD][packed::kPageTokens + 1];  // +1: conflict-free transposing writes
  float pt[kChunk][MAXD + 4];               // +4: rows stay 16-byte aligned
  uint32_t words[kMaxWords];
  uint32_t mask[kMaxWords];
  float norm[packed::kPageTokens];
  float mids[16];
};

/// MAXD: the plan's widest padded group (128: 2 CTAs per SM; 256).
template <typename TX, int MAXD>
__global__ void __launch_bounds__(kThreads, MAXD <= 128 ? 2 : 1) prefill_kernel(
    const HeadTables* __restrict__ tables, const float* __restrict__ rot,
    const int32_t* __restrict__ chans, const float* __restrict__ levels, uint8_t* __restrict__ pool,
    size_t page_bytes, const int32_t* __restrict__ page_table, int max_pages,
    const int32_t* __restrict__ seq_lens, const TX* __restrict__ k, const TX* __restrict__ v,
    int n_tokens, int n_kv_heads, int head_dim) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  constexpr int kMaxDim = MAXD;
  PrefillSmem<MAXD>& S = *reinterpret_cast<PrefillSmem<MAXD>*>(smem_raw);
  const int b = blockIdx.z, h = blockIdx.y >> 1, s = blockIdx.y & 1;
  const int start = seq_lens[b];
  const int pg = start / packed::kPageTokens + blockIdx.x;  // logical page
  const int lo = max(start, pg * packed::kPageTokens) - pg * packed::kPageTokens;
  const int hi = min(start + n_tokens, (pg + 1) * packed::kPageTokens) - pg * packed::kPageTokens;
  if (lo >= hi) return;  // block-uniform
  const HeadTables& T = tables[h];
  uint8_t* base = pool + (size_t)page_table[(size_t)b * max_pages + pg] * page_bytes + T.block_offset;
  const TX* x = (s == 0 ? k : v);
  const int tid = threadIdx.x, tk = tid & 63, jq = tid >> 6;  // token slot, coordinate quarter
  const bool mine = tk >= lo && tk < hi;

  for (int g = 0; g < T.n_groups[s]; ++g) {
    const int dim = T.dim[s][g], dim_pad = T.dim_pad[s][g], bits = T.bits[s][g];
    const float* R = rot + T.rot_offset[s][g];
    const int32_t* ch = chans + T.chan_offset[s][g];
    const int n_words = dim_pad / 16 * bits * packed::kWarpLanes;
    __syncthreads();  // previous group done with shared memory
    // Token vectors (gathered channels), zeros for slots outside [lo, hi).
    for (int idx = tid; idx < dim * packed::kPageTokens; idx += kThreads) {
      const int t = idx / dim, i = idx % dim;  // consecutive threads: consecutive channels
      float val = 0.f;
      if (t >= lo && t < hi) {
        const int p = pg * packed::kPageTokens + t - start;  // token index in the prompt
        val = (float)x[(((size_t)b * n_tokens + p) * n_kv_heads + h) * head_dim + ch[i]];
      }
      S.xs[i][t] = val;
    }
    for (int w = tid; w < n_words; w += kThreads) S.words[w] = S.mask[w] = 0u;
    const float* lv = levels + T.lvl_offset[s][g];
    if (tid < (1 << bits) - 1) S.mids[tid] = 0.5f * (lv[tid] + lv[tid + 1]);
    __syncthreads();
    if (tid < packed::kPageTokens) {
      float ss = 0.f;
      for (int i = 0; i < dim; ++i) ss = fmaf(S.xs[i][tid], S.xs[i][tid], ss);
      S.norm[tid] = sqrtf(ss);
    }
    // acc[m][c] = y at coordinate j = 16m + 4jq + c (unnormalized).
    float acc[kMaxDim / 16][4];
#pragma unroll
    for (int m = 0; m < kMaxDim / 16; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][c] = 0.f;
    const int n_m = dim_pad / 16;
    for (int i0 = 0; i0 < dim; i0 += kChunk) {
      const int ni = min(kChunk, dim - i0);
      __syncthreads();
      for (int idx = tid; idx < ni * dim_pad; idx += kThreads) {
        const int j = idx / ni, ii = idx % ni;  // coalesced rows of Π_g
        S.pt[ii][j] = j < dim ? R[(size_t)j * dim + i0 + ii] : 0.f;
      }
      __syncthreads();
      for (int ii = 0; ii < ni; ++ii) {
        const float xv = S.xs[i0 + ii][tk];
        const float4* prow = reinterpret_cast<const float4*>(&S.pt[ii][4 * jq]);
#pragma unroll
        for (int m = 0; m < kMaxDim / 16; ++m) {
          if (m < n_m) {
            const float4 p4 = prow[4 * m];  // coordinates 16m + 4jq .. +3 (warp broadcast)
            acc[m][0] = fmaf(p4.x, xv, acc[m][0]);
            acc[m][1] = fmaf(p4.y, xv, acc[m][1]);
            acc[m][2] = fmaf(p4.z, xv, acc[m][2]);
            acc[m][3] = fmaf(p4.w, xv, acc[m][3]);
          }
        }
      }
    }
    __syncthreads();  // norms visible
    // Codes into the page's lane words (shared atomics), ownership masks.
    const float n = S.norm[tk];
    const float inv = n > 0.f ? 1.f / n : 0.f;
    const int r = tk % 16, tt = tk / 16;
    if (mine) {
#pragma unroll
      for (int m = 0; m < kMaxDim / 16; ++m) {
        if (m >= n_m) continue;
#pragma unroll
        for (int c4 = 0; c4 < 4; ++c4) {
          const int j = 16 * m + 4 * jq + c4;
          uint32_t code = 0;
          if (j < dim) {
            const float y = acc[m][c4] * inv;
            for (int l = 0; l + 1 < (1 << bits); ++l) code += y > S.mids[l] ? 1u : 0u;
          }
          const int c = j % 16, ct = j / 16;
          const int rr = s == 0 ? r : c, cc = s == 0 ? c : r;
          const int elane = 4 * (rr % 8) + (cc % 8) / 2, e = 4 * (rr / 8) + 2 * (cc / 8) + cc % 2;
          for (int p = 0; p < bits; ++p) {
            const packed::CodeBitPos at = packed::code_bit_pos(bits, tt, e, p);
            const int wi = (ct * bits + at.word) * packed::kWarpLanes + elane;
            atomicOr(&S.mask[wi], 1u << at.bit);
            if ((code >> p) & 1u) atomicOr(&S.words[wi], 1u << at.bit);
          }
        }
      }
      if (jq == 0)
        *reinterpret_cast<__half*>(base + T.norm_offset[s][g] + 2 * tk) = __float2half_rn(n);
    }
    __syncthreads();
    uint32_t* dst = reinterpret_cast<uint32_t*>(base + T.code_offset[s][g]);
    for (int w = tid; w < n_words; w += kThreads) {
      const uint32_t mk = S.mask[w], val = S.words[w];
      if (mk == 0xffffffffu) {
        dst[w] = val;
      } else if (mk != 0u) {
        atomicAnd(&dst[w], ~mk);
        atomicOr(&dst[w], val);
      }
    }
  }
}

}  // namespace

void packed_prefill(const PackedPlan& plan, const DecodeBatch& batch, uint8_t* pool, const void* k,
                    const void* v, int n_tokens, DType dtype, void* stream_) {
  detail::check_batch(batch, "packed_prefill");
  detail::require(pool && k && v, "packed_prefill: pool, k and v must be device pointers");
  detail::require(!plan.device().has_wide, "packed_prefill: the plan has 5..8-bit groups (extension "
                  "pages); the GPU quantizers do not write them (the CPU packed cache does)");
  detail::require(n_tokens >= 1, "packed_prefill: n_tokens ", n_tokens, " must be at least 1");
  const int d = plan.head_dim();
  detail::require(d <= kMaxDim, "packed_prefill: head_dim ", d, " > ", kMaxDim, " unsupported");
  auto stream = static_cast<cudaStream_t>(stream_);
  const auto& D = plan.device();
  const int hkv = plan.layout().n_kv_heads();
  // Pages a sequence's new tokens can touch: ⌈n/64⌉, plus one when the start
  // is not page-aligned (CTAs past the range return at once).
  const int pages = (n_tokens + packed::kPageTokens - 1) / packed::kPageTokens + 1;
  dim3 grid(pages, hkv * 2, batch.batch);
  int max_pad = 0;
  for (const HeadTables& T : D.host_heads)
    for (int side = 0; side < 2; ++side)
      for (int g = 0; g < T.n_groups[side]; ++g) max_pad = std::max(max_pad, (int)T.dim_pad[side][g]);
  const size_t page_bytes = plan.layout().page_bytes();
  auto launch = [&](auto kernel, size_t smem, const auto* kp, const auto* vp) {
    RATEKV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, kThreads, smem, stream>>>(D.heads, D.rotations, D.channels, D.levels, pool,
                                            page_bytes, batch.page_table, batch.max_pages,
                                            batch.seq_lens, kp, vp, n_tokens, hkv, d);
  };
  const bool narrow = max_pad <= 128;
  switch (dtype) {
    case DType::f32: {
      const auto* kp = static_cast<const float*>(k);
      const auto* vp = static_cast<const float*>(v);
      if (narrow) launch(prefill_kernel<float, 128>, sizeof(PrefillSmem<128>), kp, vp);
      else launch(prefill_kernel<float, 256>, sizeof(PrefillSmem<256>), kp, vp);
      break;
    }
    case DType::f16: {
      const auto* kp = static_cast<const __half*>(k);
      const auto* vp = static_cast<const __half*>(v);
      if (narrow) launch(prefill_kernel<__half, 128>, sizeof(PrefillSmem<128>), kp, vp);
      else launch(prefill_kernel<__half, 256>, sizeof(PrefillSmem<256>), kp, vp);
      break;
    }
    default: detail::throw_error(detail::cat("packed_prefill: unsupported input dtype ", (int)dtype));
  }
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ratekv::cuda
