// Quantize-prefill: a whole prompt's keys and values of one layer into the
// packed cache (TurboQuant-MSE, docs/design.md §2; bit placement:
// docs/packed_format.md §3). Two variants (PrefillVariant):
//
// tensor_cores (default): the rotation Y = X Π_gᵀ of every (side, KV head) is
// one strided-batched cuBLAS GEMM on the tensor cores — [rows, head_dim] ×
// [head_dim, head_dim] per KV head with the plan's dense per-head matrix
// (PackedPlan::Device::prefill_m16/m32: every group's Π_gᵀ at its channels'
// rows and its own output columns), fp16 operands (TF32 for fp32 inputs),
// fp32 accumulate and fp32 output into a stream-ordered workspace
// (cudaMallocAsync, ≤ 64 MiB: prompts beyond it run in chunks of whole
// sequences or of 64-token multiples); then the quantize kernel below reads
// the rotated values instead of computing them.
// fp32: the quantize kernel computes Y itself in fp32 on the CUDA cores
// (the v9 kernel; the codes of the CPU reference up to fp32 summation order).
//
// Quantize kernel: grid (pages touched per sequence, n_kv_heads · 2 sides,
// sequences of the chunk), 256 threads, 2 CTAs per SM when every group has
// ≤ 128 channels. A CTA owns one (page, KV head, side); per channel group:
//  fp32 variant: it stages the page's ≤ 64 token vectors (gathered channels,
//    fp32) in shared memory, takes their norms, computes Y = X Π_gᵀ with Π_gᵀ
//    staged in 32-row chunks (thread = one token × 4·⌈m/16⌉ coordinates,
//    16-byte broadcast loads of Π), counts the Lloyd–Max midpoints below y/n
//    and assembles the page's lane words in shared memory (shared atomics);
//  tensor_cores variant: each warp loads 8 tokens' gathered inputs (norms by
//    warp reductions) and their rotated rows from the GEMM's output, all of a
//    thread's loads in flight at once, into shared memory; then one thread per
//    (16-channel tile, lane) computes the codes of its lane words and
//    assembles them in registers.
// Both write whole words where the CTA owns all their bits, else an atomic
// clear + set of exactly its tokens' bits (other tokens' bits of a page are
// never touched, as docs/packed_format.md §5 requires).
#include <cublas_v2.h>

#include <algorithm>
#include <type_traits>

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

/// Shared memory of the tensor-core variant: the page's rotated rows (after
/// the gathered inputs, for the norms), norms, midpoints.
template <int MAXD>
struct RotatedSmem {
  float xs[MAXD][packed::kPageTokens + 1];
  float norm[packed::kPageTokens];
  float mids[16];
};

/// The BITS lane words (w = 0..BITS−1) of 16-channel tile ct, lane elane of a
/// group's page block, from the page's rotated rows xs[j][t] (unnormalized),
/// norms and midpoints: per docs/packed_format.md §3 the word gathers the
/// codes of elements e = 0..7 of token tiles tt = 0..3 of that lane (keys:
/// row rr = token, column cc = channel; values transposed), at
/// packed::code_bit_pos. Tokens outside [lo, hi) are not this launch's: their
/// bits are left as they are (whole-word store when the launch owns every
/// bit, else an atomic clear + set of its bits). Coordinates j ≥ dim
/// (padding) get code 0.
template <int BITS, int MAXD>
__device__ __forceinline__ void assemble_lane_words(const float (*xs)[packed::kPageTokens + 1],
                                                    const float* norm, const float* mids, int ct,
                                                    int elane, int dim, int lo, int hi, bool key,
                                                    uint32_t* dst) {
  constexpr int kLevels = 1 << BITS;
  float mid[kLevels - 1];
#pragma unroll
  for (int l = 0; l + 1 < kLevels; ++l) mid[l] = mids[l];
  uint32_t wv[BITS], wm[BITS];
#pragma unroll
  for (int w = 0; w < BITS; ++w) wv[w] = wm[w] = 0u;
#pragma unroll
  for (int tt = 0; tt < 4; ++tt)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int rr = elane / 4 + 8 * (e / 4), cc = 2 * (elane % 4) + 8 * ((e / 2) % 2) + (e % 2);
      const int t = 16 * tt + (key ? rr : cc), j = 16 * ct + (key ? cc : rr);
      if (t < lo || t >= hi) continue;
      uint32_t code = 0;
      if (j < dim) {
        const float n = norm[t];
        const float y = xs[j][t] * (n > 0.f ? 1.f / n : 0.f);
#pragma unroll
        for (int l = 0; l + 1 < kLevels; ++l) code += y > mid[l] ? 1u : 0u;
      }
#pragma unroll
      for (int p = 0; p < BITS; ++p) {
        const packed::CodeBitPos at = packed::code_bit_pos(BITS, tt, e, p);
        wm[at.word] |= 1u << at.bit;
        wv[at.word] |= ((code >> p) & 1u) << at.bit;
      }
    }
#pragma unroll
  for (int w = 0; w < BITS; ++w) {
    uint32_t* d = dst + (ct * BITS + w) * packed::kWarpLanes + elane;
    if (wm[w] == 0xffffffffu) {
      *d = wv[w];
    } else if (wm[w] != 0u) {
      atomicAnd(d, ~wm[w]);
      atomicOr(d, wv[w]);
    }
  }
}

/// MAXD: the plan's widest padded group (128 or 256). ROTATED: y comes from
/// yk / yv (the GEMM's output: row (b − b0)·nc + (p − p0), (n_kv_heads,
/// head_dim) fp32 per row, group g at columns off_g …) instead of being
/// computed here. The launch covers prompt tokens p ∈ [p0, p0 + nc) of
/// sequences b0 + blockIdx.z (at positions seq_lens[b] + p).
template <typename TX, int MAXD, bool ROTATED>
__global__ void __launch_bounds__(kThreads, MAXD <= 128 ? 2 : 1)
    prefill_kernel(const HeadTables* __restrict__ tables, const float* __restrict__ rot,
                   const int32_t* __restrict__ chans, const float* __restrict__ levels,
                   uint8_t* __restrict__ pool, size_t page_bytes,
                   const int32_t* __restrict__ page_table, int max_pages,
                   const int32_t* __restrict__ seq_lens, const TX* __restrict__ k,
                   const TX* __restrict__ v, const float* __restrict__ yk,
                   const float* __restrict__ yv, int n_tokens, int n_kv_heads, int head_dim,
                   int b0, int p0, int nc) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  constexpr int kMaxDim = MAXD;
  using Smem = std::conditional_t<ROTATED, RotatedSmem<MAXD>, PrefillSmem<MAXD>>;
  Smem& S = *reinterpret_cast<Smem*>(smem_raw);
  const int b = b0 + blockIdx.z, h = blockIdx.y >> 1, s = blockIdx.y & 1;
  const int s0 = seq_lens[b];     // cached length before the prefill
  const int start = s0 + p0;      // first position this launch writes
  const int pg = start / packed::kPageTokens + blockIdx.x;  // logical page
  const int lo = max(start, pg * packed::kPageTokens) - pg * packed::kPageTokens;
  const int hi = min(start + nc, (pg + 1) * packed::kPageTokens) - pg * packed::kPageTokens;
  if (lo >= hi) return;  // block-uniform
  const HeadTables& T = tables[h];
  uint8_t* base = pool + (size_t)page_table[(size_t)b * max_pages + pg] * page_bytes + T.block_offset;
  const TX* x = (s == 0 ? k : v);
  const float* yr = (s == 0 ? yk : yv);
  const size_t y_row_stride = (size_t)n_kv_heads * head_dim;
  int y_off = 0;  // output column of the group's first rotated coordinate
  const int tid = threadIdx.x, tk = tid & 63, jq = tid >> 6;  // token slot, coordinate quarter
  const bool mine = tk >= lo && tk < hi;

  for (int g = 0; g < T.n_groups[s]; y_off += T.dim[s][g], ++g) {
    const int dim = T.dim[s][g], dim_pad = T.dim_pad[s][g], bits = T.bits[s][g];
    const float* R = rot + T.rot_offset[s][g];
    const int32_t* ch = chans + T.chan_offset[s][g];
    const int n_words = dim_pad / 16 * bits * packed::kWarpLanes;
    if constexpr (ROTATED) {
      // Warp w takes tokens w, w + 8, …; lane l coordinates / channels l + 32c.
      // All of a thread's loads are issued before any is used (8 tokens ×
      // MAXD/32 values in flight); the norms come from the gathered inputs by
      // warp reductions; the rotated rows go to shared memory.
      constexpr int kWarps = kThreads / 32, kTokPerWarp = packed::kPageTokens / kWarps, kPerLane = MAXD / 32;
      const int warp = tid >> 5, lane = tid & 31;
      const float* lv = levels + T.lvl_offset[s][g];
      __syncthreads();  // previous group done with shared memory
      if (tid < (1 << bits) - 1) S.mids[tid] = 0.5f * (lv[tid] + lv[tid + 1]);
      int chl[kPerLane];
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) chl[c] = lane + 32 * c < dim ? ch[lane + 32 * c] : 0;
      float v[kTokPerWarp][kPerLane];
      // Inputs → norms (warp reductions over the group's channels).
#pragma unroll
      for (int q = 0; q < kTokPerWarp; ++q) {
        const int t = warp + kWarps * q;
        const bool ok = t >= lo && t < hi;
        const int p = pg * packed::kPageTokens + t - s0;  // token index in the prompt (when ok)
        const TX* xrow = x + (((size_t)b * n_tokens + (ok ? p : 0)) * n_kv_heads + h) * head_dim;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) v[q][c] = ok && lane + 32 * c < dim ? (float)xrow[chl[c]] : 0.f;
      }
#pragma unroll
      for (int q = 0; q < kTokPerWarp; ++q) {
        float ss = 0.f;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) ss = fmaf(v[q][c], v[q][c], ss);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) S.norm[warp + kWarps * q] = sqrtf(ss);
      }
      // Rotated rows (the GEMM's output) → shared memory, coordinate-major.
#pragma unroll
      for (int q = 0; q < kTokPerWarp; ++q) {
        const int t = warp + kWarps * q;
        const bool ok = t >= lo && t < hi;
        const int p = pg * packed::kPageTokens + t - s0;
        const float* yrow = yr + ((size_t)(b - b0) * nc + (ok ? p - p0 : 0)) * y_row_stride +
                            (size_t)h * head_dim + y_off;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) v[q][c] = ok && lane + 32 * c < dim ? yrow[lane + 32 * c] : 0.f;
      }
#pragma unroll
      for (int q = 0; q < kTokPerWarp; ++q)
#pragma unroll
        for (int c = 0; c < kPerLane; ++c)
          if (lane + 32 * c < dim) S.xs[lane + 32 * c][warp + kWarps * q] = v[q][c];
      __syncthreads();  // rotated rows, norms and midpoints visible
      if (tid >= lo && tid < hi)
        *reinterpret_cast<__half*>(base + T.norm_offset[s][g] + 2 * tid) = __float2half_rn(S.norm[tid]);
      // One thread per (16-channel tile, lane): all b lane words of it,
      // assembled in registers, no shared atomics.
      uint32_t* dst = reinterpret_cast<uint32_t*>(base + T.code_offset[s][g]);
      for (int u = tid; u < dim_pad / 16 * packed::kWarpLanes; u += kThreads) {
        const int ct = u / packed::kWarpLanes, elane = u % packed::kWarpLanes;
        switch (bits) {
          case 1: assemble_lane_words<1, MAXD>(S.xs, S.norm, S.mids, ct, elane, dim, lo, hi, s == 0, dst); break;
          case 2: assemble_lane_words<2, MAXD>(S.xs, S.norm, S.mids, ct, elane, dim, lo, hi, s == 0, dst); break;
          case 3: assemble_lane_words<3, MAXD>(S.xs, S.norm, S.mids, ct, elane, dim, lo, hi, s == 0, dst); break;
          default: assemble_lane_words<4, MAXD>(S.xs, S.norm, S.mids, ct, elane, dim, lo, hi, s == 0, dst); break;
        }
      }
      continue;
    } else {
    __syncthreads();  // previous group done with shared memory
    // Token vectors (gathered channels), zeros for slots outside [lo, hi).
    for (int idx = tid; idx < dim * packed::kPageTokens; idx += kThreads) {
      const int t = idx / dim, i = idx % dim;  // consecutive threads: consecutive channels
      float val = 0.f;
      if (t >= lo && t < hi) {
        const int p = pg * packed::kPageTokens + t - s0;  // token index in the prompt
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
    const int n_m = dim_pad / 16;
    {
#pragma unroll
      for (int m = 0; m < kMaxDim / 16; ++m)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[m][c] = 0.f;
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
    }  // fp32 variant
  }
}

}  // namespace

namespace {

/// cuBLAS handle of this host thread for (current device, `stream`), bound to
/// that stream with its own 32 MiB workspace (set after the stream:
/// cublasSetStream resets a handle's workspace to cuBLAS's default pool), so
/// calls under stream capture do not allocate and two streams never share a
/// workspace. Created on first use; destroyed (handle and workspace) when the
/// thread exits. Throws Error when cuBLAS or the allocation fails.
cublasHandle_t prefill_cublas(cudaStream_t stream) {
  struct Handle {
    int device = -1;
    cudaStream_t stream = nullptr;
    cublasHandle_t h = nullptr;
    void* ws = nullptr;
  };
  struct Handles {
    std::vector<Handle> v;
    ~Handles() {  // thread exit: errors are ignored (the context may already be gone at process exit)
      for (const Handle& e : v) {
        if (e.h) cublasDestroy(e.h);
        if (e.ws) cudaFree(e.ws);
      }
    }
  };
  thread_local Handles handles;
  int dev = 0;
  RATEKV_CUDA_CHECK(cudaGetDevice(&dev));
  for (const Handle& e : handles.v)
    if (e.device == dev && e.stream == stream) return e.h;
  Handle e{dev, stream, nullptr, nullptr};
  detail::require(cublasCreate(&e.h) == CUBLAS_STATUS_SUCCESS, "packed_prefill: cublasCreate failed");
  constexpr size_t kWs = size_t{32} << 20;
  const cudaError_t err = cudaMalloc(&e.ws, kWs);
  if (err != cudaSuccess) {
    cublasDestroy(e.h);
    detail::require(false, "packed_prefill: cudaMalloc of the 32 MiB cuBLAS workspace failed: ",
                    cudaGetErrorString(err));
  }
  if (cublasSetStream(e.h, stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(e.h, e.ws, kWs) != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(e.h);
    cudaFree(e.ws);
    detail::require(false, "packed_prefill: binding the cuBLAS handle to its stream and workspace failed");
  }
  handles.v.push_back(e);  // owned from here on (freed at thread exit)
  return e.h;
}

void cublas_ok(cublasStatus_t st, const char* what) {
  detail::require(st == CUBLAS_STATUS_SUCCESS, "packed_prefill: ", what, " failed (cuBLAS status ",
                  (int)st, ")");
}

}  // namespace

namespace {
constexpr size_t kWorkspaceCap = size_t{64} << 20;  // rotated rows of one chunk, both sides
// Rows of one chunk of the rotation GEMM whose fp32 output of both sides fits
// `cap` bytes: a multiple of 64 (≥ 64).
int chunk_rows(size_t row_bytes, size_t cap) {
  return std::max<int>(packed::kPageTokens, (int)(cap / row_bytes) / packed::kPageTokens * packed::kPageTokens);
}
}  // namespace

size_t prefill_scratch_bytes(int n_kv_heads, int head_dim, int64_t rows) {
  const size_t row_bytes = (size_t)2 * n_kv_heads * head_dim * sizeof(float);
  const int64_t r = (std::max<int64_t>(rows, 1) + packed::kPageTokens - 1) / packed::kPageTokens * packed::kPageTokens;
  return (size_t)std::min<int64_t>(r, chunk_rows(row_bytes, kWorkspaceCap)) * row_bytes;
}

void packed_prefill(const PackedPlan& plan, const DecodeBatch& batch, uint8_t* pool, const void* k,
                    const void* v, int n_tokens, DType dtype, void* stream_, PrefillVariant variant,
                    const PrefillScratch* scratch) {
  detail::check_batch(batch, "packed_prefill");
  detail::require(pool && k && v, "packed_prefill: pool, k and v must be device pointers");
  detail::require(!plan.device().has_wide, "packed_prefill: the plan has 5..8-bit groups (extension "
                  "pages); the GPU quantizers do not write them (the CPU packed cache does)");
  detail::require(n_tokens >= 1, "packed_prefill: n_tokens ", n_tokens, " must be at least 1");
  detail::require(dtype == DType::f32 || dtype == DType::f16, "packed_prefill: unsupported input dtype ",
                  (int)dtype);
  const int d = plan.head_dim();
  detail::require(d <= kMaxDim, "packed_prefill: head_dim ", d, " > ", kMaxDim, " unsupported");
  auto stream = static_cast<cudaStream_t>(stream_);
  const auto& D = plan.device();
  const int hkv = plan.layout().n_kv_heads();
  int max_pad = 0;
  for (const HeadTables& T : D.host_heads)
    for (int side = 0; side < 2; ++side)
      for (int g = 0; g < T.n_groups[side]; ++g) max_pad = std::max(max_pad, (int)T.dim_pad[side][g]);
  const size_t page_bytes = plan.layout().page_bytes();
  const bool narrow = max_pad <= 128;
  const bool f16 = dtype == DType::f16;
  // One quantize launch over prompt tokens [p0, p0 + nc) of sequences
  // [b0, b0 + nb): pages the tokens can touch, ⌈nc/64⌉ plus one when the
  // start is not page-aligned (CTAs past the range return at once).
  auto quantize = [&](auto rotated, const float* yk, const float* yv, int b0, int nb, int p0, int nc) {
    constexpr bool R = decltype(rotated)::value;
    const dim3 grid((nc + packed::kPageTokens - 1) / packed::kPageTokens + 1, hkv * 2, nb);
    auto launch = [&](auto kernel, size_t smem, const auto* kp, const auto* vp) {
      RATEKV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      kernel<<<grid, kThreads, smem, stream>>>(D.heads, D.rotations, D.channels, D.levels, pool, page_bytes,
                                              batch.page_table, batch.max_pages, batch.seq_lens, kp, vp, yk,
                                              yv, n_tokens, hkv, d, b0, p0, nc);
    };
    using S128 = std::conditional_t<R, RotatedSmem<128>, PrefillSmem<128>>;
    using S256 = std::conditional_t<R, RotatedSmem<256>, PrefillSmem<256>>;
    if (f16) {
      const auto* kp = static_cast<const __half*>(k);
      const auto* vp = static_cast<const __half*>(v);
      if (narrow) launch(prefill_kernel<__half, 128, R>, sizeof(S128), kp, vp);
      else launch(prefill_kernel<__half, 256, R>, sizeof(S256), kp, vp);
    } else {
      const auto* kp = static_cast<const float*>(k);
      const auto* vp = static_cast<const float*>(v);
      if (narrow) launch(prefill_kernel<float, 128, R>, sizeof(S128), kp, vp);
      else launch(prefill_kernel<float, 256, R>, sizeof(S256), kp, vp);
    }
    RATEKV_CUDA_CHECK(cudaGetLastError());
  };
  if (variant == PrefillVariant::fp32) {
    quantize(std::false_type{}, nullptr, nullptr, 0, batch.batch, 0, n_tokens);
    return;
  }
  detail::require(variant == PrefillVariant::tensor_cores, "packed_prefill: unknown variant ", (int)variant);
  detail::require(f16 ? D.prefill_m16 != nullptr : D.prefill_m32 != nullptr,
                  "packed_prefill: the plan has no prefill rotation matrix for ", f16 ? "fp16" : "fp32",
                  " inputs (built with PrefillMatrices::", f16 ? "f32 or none)" : "f16 or none)");
  // Rows of the GEMM per chunk: the fp32 output of both sides ≤ 64 MiB, or
  // what the caller's scratch buffer holds.
  const size_t row_bytes = (size_t)2 * hkv * d * sizeof(float);
  const size_t total_rows = (size_t)batch.batch * n_tokens;
  int cap_rows = chunk_rows(row_bytes, kWorkspaceCap);
  size_t ws_rows = std::min<size_t>(total_rows, (size_t)cap_rows);
  // Stream-ordered workspace (no scratch), freed on every exit (an exception
  // from cuBLAS or a launch check included).
  struct AsyncBuffer {
    float* p = nullptr;
    cudaStream_t s;
    ~AsyncBuffer() {
      if (p) cudaFreeAsync(p, s);
    }
  } buf{nullptr, stream};
  float* ws = nullptr;
  cublasHandle_t cb = nullptr;
  if (scratch) {
    detail::require(scratch->cublas && scratch->buffer, "packed_prefill: scratch needs a cuBLAS handle and a buffer");
    const size_t have = scratch->bytes / row_bytes;
    detail::require(have >= (size_t)packed::kPageTokens || have >= total_rows, "packed_prefill: scratch buffer of ",
                    scratch->bytes, " bytes holds ", have, " rows; at least ", packed::kPageTokens,
                    " (prefill_scratch_bytes(", hkv, ", ", d, ", 64) = ", prefill_scratch_bytes(hkv, d, 64), ")");
    cb = static_cast<cublasHandle_t>(scratch->cublas);
    cudaStream_t bound = nullptr;
    cublas_ok(cublasGetStream(cb, &bound), "cublasGetStream (scratch handle)");
    detail::require(bound == stream, "packed_prefill: the scratch cuBLAS handle is bound to another stream");
    if (have >= total_rows) {
      ws_rows = total_rows;
    } else {
      cap_rows = (int)std::min<size_t>(have / packed::kPageTokens * packed::kPageTokens, (size_t)INT32_MAX / 2);
      ws_rows = (size_t)cap_rows;
    }
    ws = static_cast<float*>(scratch->buffer);
  } else {
    RATEKV_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf.p), ws_rows * row_bytes, stream));
    ws = buf.p;
    cb = prefill_cublas(stream);
  }
  float* yk = ws;
  float* yv = ws + ws_rows * hkv * d;
  const size_t in_el = f16 ? 2 : 4;
  // Y rows [r0, r0 + rows) of both sides: column-major Yᵀ (d × rows per head,
  // ld hkv·d) = Mᵀ (d × d, M row-major) · Xᵀ (d × rows, ld hkv·d), one batch
  // entry per KV head.
  auto gemm = [&](size_t r0, int rows) {
    const float one = 1.f, zero = 0.f;
    for (int s = 0; s < 2; ++s) {
      const void* x = static_cast<const uint8_t*>(s == 0 ? k : v) + r0 * hkv * d * in_el;
      const void* m = f16 ? static_cast<const void*>(D.prefill_m16 + (size_t)s * hkv * d * d)
                          : static_cast<const void*>(D.prefill_m32 + (size_t)s * hkv * d * d);
      const cudaDataType ty = f16 ? CUDA_R_16F : CUDA_R_32F;
      cublas_ok(cublasGemmStridedBatchedEx(cb, CUBLAS_OP_N, CUBLAS_OP_N, d, rows, d, &one, m, ty, d,
                                           (long long)d * d, x, ty, hkv * d, (long long)d, &zero,
                                           s == 0 ? yk : yv, CUDA_R_32F, hkv * d, (long long)d, hkv,
                                           f16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32,
                                           CUBLAS_GEMM_DEFAULT),
                "cublasGemmStridedBatchedEx (rotation)");
    }
  };
  if ((size_t)n_tokens <= ws_rows) {
    // Whole sequences per chunk.
    const int per = (int)(ws_rows / n_tokens);
    for (int b0 = 0; b0 < batch.batch; b0 += per) {
      const int nb = std::min(per, batch.batch - b0);
      gemm((size_t)b0 * n_tokens, nb * n_tokens);
      quantize(std::true_type{}, yk, yv, b0, nb, 0, n_tokens);
    }
  } else {
    // One sequence at a time, in chunks of cap_rows tokens (64-token multiples).
    for (int b = 0; b < batch.batch; ++b)
      for (int p0 = 0; p0 < n_tokens; p0 += cap_rows) {
        const int nc = std::min(cap_rows, n_tokens - p0);
        gemm((size_t)b * n_tokens + p0, nc);
        quantize(std::true_type{}, yk, yv, b, 1, p0, nc);
      }
  }
  if (buf.p) {
    buf.p = nullptr;
    RATEKV_CUDA_CHECK(cudaFreeAsync(ws, stream));
  }
}

}  // namespace ratekv::cuda
