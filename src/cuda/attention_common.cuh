// Shared pieces of the decode-attention kernels: the mma.m16n8k16 wrapper,
// cp.async, the per-warp online-softmax state over a 16×16 score tile, the
// split-K partial-state layout and the device tables of a PackedPlan.
//
// Register fragment convention (PTX ISA, mma.m16n8k16 .f16, g = lane/4, t = lane%4):
//   A (16×16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16×8, "col"):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16×8, f32):        c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// The packed format stores, per 16×16 tile, bit e = 4h + 2kk + p of lane L's
// byte = element (n-half h, k-half kk, pair element p): exactly b0/b1 of n-half h.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "head_tables.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/model/sliding_window.h"

namespace ratekv::cuda::detail {

#define RATEKV_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    cudaError_t _e = (expr);                                                                 \
    if (_e != cudaSuccess)                                                                   \
      ::ratekv::cuda::detail::throw_error(::ratekv::cuda::detail::cat(                      \
          "CUDA: ", #expr, " failed: ", cudaGetErrorString(_e), " (", __FILE__, ":", __LINE__, ")")); \
  } while (0)

inline constexpr float kLog2e = 1.4426950408889634f;

// ---- device helpers -------------------------------------------------------------

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack_halves(__half lo, __half hi) {
  __half2 h = __halves2half2(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Programmatic dependent launch (sm_90): a kernel launched with
/// cudaLaunchAttributeProgrammaticStreamSerialization may start before the
/// previous kernel of the stream ends; it must wait (grid_dependency_wait)
/// before reading that kernel's outputs. The previous kernel lets it start
/// early with allow_dependent_launch. Both are no-ops without such a launch.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;" :::); }

/// Online softmax over score tiles for the 16 query rows of a warp: this lane
/// owns rows g and g+8. S (scores, natural-log scale) holds the C fragments of
/// the two n-halves; on return S holds P = exp(S − m_new) and `alpha` the
/// factor the accumulators must be scaled by. m is kept in log2 units.
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};  // running max of scores·log2e, rows g, g+8
  float l[2] = {0.f, 0.f};              // this lane's partial row sums

  __device__ __forceinline__ void update(float (&S)[2][4], float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(fmaxf(S[0][2 * r], S[0][2 * r + 1]), fmaxf(S[1][2 * r], S[1][2 * r + 1]));
      mx *= kLog2e;
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx);  // finite: every tile has a valid token
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float p = exp2f(fmaf(S[h][2 * r + i], kLog2e, -m_new));
          S[h][2 * r + i] = p;
          sum += p;
        }
      l[r] = l[r] * alpha[r] + sum;
    }
  }
};

/// Split-K partial states in the workspace (fp32):
///   o_part (batch·n_heads, n_splits, o_dim)  unnormalized Σ p_t v_t (rotated domain)
///   m_part, l_part (batch·n_heads, n_splits) max (log2 units) and Σ p_t
/// n_splits is the row stride of the states, except in the GQA ≤ 8 kernel's
/// launch, which reads it as its split (warp) count and writes one state per
/// CTA at stride ⌈n_splits / gqa8_splits_per_cta⌉ (launch_gqa8_decode).
struct Partials {
  float* o;
  float* m;
  float* l;
  int n_splits;
  int o_dim;  // rotated channels (tiles·16) or head_dim
};

/// Writes one warp's state (rows < n_rows) as split `split`.
template <int NT>
__device__ __forceinline__ void store_partial(const Partials& P, int row_base, int n_rows, int split,
                                              RowState& st, const float (&O)[NT][2][4],
                                              int n_tiles) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = st.l[r];
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (row >= n_rows) continue;
    const size_t idx = (size_t)(row_base + row) * P.n_splits + split;
    if (t == 0) {
      P.m[idx] = st.m[r];
      P.l[idx] = l[r];
    }
    float* o = P.o + idx * P.o_dim;
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      if (vt >= n_tiles) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = vt * 16 + 8 * h + 2 * t;
        *reinterpret_cast<float2*>(o + c) = make_float2(O[vt][h][2 * r], O[vt][h][2 * r + 1]);
      }
    }
  }
}

/// Writes the empty state (no tokens in this split) for rows < n_rows: m = −∞,
/// l = 0, o = 0 (so the merge may weight it by 0 without reading garbage).
__device__ __forceinline__ void store_empty(const Partials& P, int row_base, int n_rows, int split) {
  const int lane = threadIdx.x & 31;
  for (int row = 0; row < n_rows; ++row) {
    const size_t idx = (size_t)(row_base + row) * P.n_splits + split;
    if (lane == 0) {
      P.m[idx] = -INFINITY;
      P.l[idx] = 0.f;
    }
    for (int c = lane; c < P.o_dim; c += 32) P.o[idx * P.o_dim + c] = 0.f;
  }
}

/// Code of rotated coordinate j of a group (bits ≤ 4 part) at token slot
/// `slot`: `seg` = the group's code segment (page + head block + code offset).
__device__ __forceinline__ uint32_t read_code(const uint8_t* __restrict__ seg, int bits, int side,
                                              int slot, int j) {
  const int ct = j >> 4, tt = slot >> 4;
  const packed::ElementPos ep =
      packed::element_pos(side == 0 ? packed::Side::key : packed::Side::value, slot & 15, j & 15);
  uint32_t code = 0;
  for (int i = 0; i < bits; ++i) {
    const packed::CodeBitPos at = packed::code_bit_pos(bits, tt, ep.elem, i);
    const uint32_t w = *reinterpret_cast<const uint32_t*>(
        seg + ((size_t)(ct * bits + at.word) * packed::kWarpLanes + ep.lane) * 4);
    code |= ((w >> at.bit) & 1u) << i;
  }
  return code;
}

// ---- host helpers ---------------------------------------------------------------

/// Tokens the split-K partition of `batch` covers when its kernel reads whole
/// units of `unit` tokens (DecodeBatch::window; model/sliding_window.h).
inline int decode_span(const DecodeBatch& batch, int unit) {
  return static_cast<int>(window_span_tokens(batch.max_seq_len, batch.window, unit));
}
/// Refuses a sliding window in a kernel that does not implement one.
inline void require_no_window(const DecodeBatch& batch, const char* what) {
  require(batch.window == 0, what, ": window ", batch.window,
          " (sliding-window attention) is not implemented by this kernel (fp16 and packed GQA <= 8 with 1..4-bit "
          "groups are)");
}

/// Carves the workspace: rotated query (fp16) then partial states.
struct WorkspaceView {
  __half* q;  // (batch·n_heads, q_dim)
  Partials part;
  int* counters;  // (batch·n_heads) int32: the fused fp16 kernel's arrival counters
};
WorkspaceView carve_workspace(void* ws, size_t ws_bytes, int batch, int n_heads, int head_dim,
                              int n_splits);

/// Device ordinals the per-instance shared-memory caches track.
inline constexpr int kMaxDevices = 64;

/// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current
/// device unless `cache[device]` (one cache per kernel instance, zeroed) says it
/// already is: cudaFuncSetAttribute once per instance instead of per call.
/// max_carveout: also prefer the largest shared-memory carveout (a kernel
/// whose blocks per SM are counted on it, not left to the driver's choice).
/// Throws Error on a CUDA failure (e.g. more than the device's maximum).
void set_smem_limit(const void* kernel, size_t bytes, int (&cache)[kMaxDevices], bool max_carveout = false);

/// Launches `kernel` with programmatic dependent launch (sm_90): it may start
/// before the previous kernel of `stream` ends and must call
/// grid_dependency_wait() before reading that kernel's outputs.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  RATEKV_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

/// Splits (warps) per CTA of the GQA ≤ 8 kernel at head_dim: 8 (4 for head_dim > 128).
int gqa8_splits_per_cta(int head_dim);

/// Launches the GQA ≤ 8 kernel (decode_attention_gqa8.cu) over `pool` with
/// w.part.n_splits splits (one warp each, gqa8_splits_per_cta of them per
/// CTA); each CTA merges its splits. int8: int8 levels, integer Q·Kᵀ and P·V
/// (cuda::uses_int8_levels) — the uniform instance when
/// plan.device().uniform_bits > 0, else the general int8 one (widths and
/// codebooks per group from the head tables); else the general fp16 one
/// (PackedDecodeVariant::runtime_tables). fused_out null: one state per CTA into w.part
/// with row stride C = ⌈n_splits / gqa8_splits_per_cta⌉ (state c of row r at
/// r·C + c) — merge them with launch_splitk_lse_merge on a view whose
/// part.n_splits is C; fused_out set: with w.part.n_splits ≤
/// gqa8_splits_per_cta(head_dim) (one CTA per (sequence, KV head)) the CTA
/// rotates back into fused_out (batch·n_heads, head_dim) fp32 itself — what
/// launch_splitk_lse_merge would write — and no merge launch follows. Throws Error for GQA > 8,
/// 5..8-bit groups, head_dim ∉ {64, 128, 256}, or fused_out with more splits
/// than one CTA holds.
void launch_gqa8_decode(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                        const WorkspaceView& w, int pages_per_split, bool int8,
                        cudaStream_t stream, float* fused_out = nullptr);

/// Launches the query prologue: (batch·n_heads, kMaxTiles·16) fp16 rows of
/// scale·Π_g q_g per key group (tables == nullptr: scale·q, unrotated); with
/// zero_counters it also sets zero_counters[b·n_kv_heads + h] = 0 for every
/// (sequence, KV head) (the fused fp16 kernel's arrival counters).
/// n_cols: the columns any head writes — PackedPlan::Device::max_tiles[0]·16
/// with tables (0 when no head has a key group), head_dim without; the grid
/// covers ⌈n_cols/8⌉ columns octets (at least one, for the counters) instead
/// of all kMaxTiles·16 / 8 (at head_dim 128, 20 of 36 did nothing), several
/// per block (each warp rotating several coordinates) when one per block
/// would take more than one wave of the device (detail::sm_count()).
/// Columns ≥ a head's n_tiles[0]·16 are not written (no kernel reads them).
/// Throws Error for GQA ∉ 1..16, head_dim > 256 or n_cols ∉ 0..kMaxTiles·16.
void launch_rotate_query(const void* q, bool q_f16, int batch, int n_heads, int head_dim, int gqa,
                         float scale, const HeadTables* tables, const float* rot,
                         const int32_t* chans, int n_cols, __half* out, cudaStream_t stream,
                         int* zero_counters = nullptr);

/// Launches the split-K epilogue (splitk_lse_merge.cu): the log-sum-exp merge
/// of the split states and the back-rotation,
/// out[b,q,:] = Σ_g Π_gᵀ o_g (tables == nullptr: identity, o_dim == head_dim).
void launch_splitk_lse_merge(const WorkspaceView& w, int batch, int n_heads, int gqa, int head_dim,
                             const HeadTables* tables, const float* rotations, const int32_t* channels,
                             float* out, cudaStream_t stream);

/// Resident warps per SM of the GQA ≤ 8 fp16 kernel at head_dim (shared memory bound).
int fp16_n8_warps_per_sm(int head_dim);

/// Launches the GQA ≤ 8 fp16 kernel (decode_attention_fp16_n8.cu) over the fp16
/// pages of `pool`: split states into w.part (merge with launch_merge, no
/// tables) — or, with fused_out, merged into fused_out (batch·n_heads,
/// head_dim) fp32 by the last CTA of each (sequence, KV head) to finish
/// (w.counters zeroed by the query kernel before). Throws Error for GQA > 8
/// or head_dim ∉ {64, 128, 256}.
void launch_fp16_n8(int n_kv_heads, int head_dim, const DecodeBatch& batch, const uint16_t* pool,
                    const WorkspaceView& w, int tiles_per_split, int n_heads, int gqa,
                    cudaStream_t stream, float* fused_out = nullptr);

/// Launches the generic (non-tensor-core) attention kernel over the pages of
/// `pool` (and `ext_pool` for 5..8-bit groups): split states into w.part
/// (decode_attention_generic.cu). Throws Error when the plan has wide groups
/// and ext_pool is null.
void launch_generic_decode(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                           const uint8_t* ext_pool, const WorkspaceView& w, int pages_per_split,
                           cudaStream_t stream);

}  // namespace ratekv::cuda::detail

