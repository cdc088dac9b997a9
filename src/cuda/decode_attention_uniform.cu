// Fused split-K decode attention for uniform plans — one b-bit key group and
// one b-bit value group over every KV head, b = 1..4, GQA ≤ 8 (variant
// `specialized`; DESIGN.md §6, §8; docs/packed_format.md, format version 2).
//
// Transposed orientation: the GQA query rows are the N = 8 side of the MMAs
// and the decoded codes the A operand, so no tensor-core row is a padding row:
//   Sᵀ (16 tokens × 8 rows) += K (A: 16 tokens × 32 channels, int8 levels)
//                               · Q̃ᵀ (B: 32 × 8, int8 hi and lo parts)      mma.m16n8k32.s8, int32
//   Oᵀ (16 channels × 8 rows) += V_tileᵀ (A: 16 channels × 16 tokens, fp16 levels)
//                               · (P ∘ n^V)ᵀ (B: 16 × 8, fp16)             mma.m16n8k16.f16, fp32
// The format's lane words hold exactly these A fragments (code_decode.cuh):
// a key code becomes its int8 level with one byte permute per 4 codes
// (int8_key_levels: one scale per codebook), a value code its fp16 level with
// two per 2 codes. Integer keys halve the decode work of the score side; the
// score of token t, row r is n^K_t · s_r·s_L/254 · (254·Σ hi·L + Σ lo·L),
// the scale folded into the softmax exponent. A lane owns query rows 2t, 2t+1
// (its softmax state) and tokens g, g+8 of each token tile; P moves from the C
// layout of Sᵀ to the B layout of the P·V product with movmatrix (one 8×8
// transpose per half tile).
//
// Grid (⌈n_splits/W⌉, n_kv_heads, batch), W = 8 warps per CTA (4 for
// head_dim 256), one split per warp, each warp a contiguous range of 64-token
// pages of one sequence. A page's head block (codes + norms, contiguous)
// arrives by one bulk async copy (TMA, cp.async.bulk) into one of two stages
// per warp, completion signalled on an mbarrier; the next page is in flight
// while one is computed.
#include "attention_common.cuh"
#include "code_decode.cuh"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda::detail {

namespace {

constexpr int kStages = 2;  // pages in flight per warp (current + prefetch)
// Splits (warps) per CTA: 8 (2 CTAs per SM); head_dim 256 stages twice the
// bytes per page and takes 4 so that two stages per warp fit in shared memory.
template <int D>
constexpr int kWarps = D > 128 ? 4 : 8;
static_assert(kPackedWarpsPerCta % kWarps<64> == 0 && kPackedWarpsPerCta % kWarps<256> == 0,
              "default_splits rounds to whole CTAs");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
/// Makes mbarrier initialisation visible to the async proxy (TMA).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/// Arrives once on `bar` and announces `bytes` of async-copy traffic.
__device__ __forceinline__ void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
/// Bulk async copy of `bytes` (multiple of 16, both addresses 16-byte aligned)
/// global -> shared, completion counted on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
/// Waits until the phase with parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
/// Transpose of an 8×8 b16 matrix held as one mma C/A-style fragment
/// (lane (g, t): row g, columns 2t, 2t+1) into the same fragment of the transpose.
__device__ __forceinline__ uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

/// mma.m16n8k32 with int8 A and B, int32 accumulation (fragment layout as
/// m16n8k16 with 4 int8 per register: a0 = (row g, k 4t..4t+3), a1 = (g+8, …),
/// a2 = (g, k 16+4t..), a3 = (g+8, 16+…); b0 = (k 4t..4t+3, n g), b1 = (k 16+4t.., n g)).
__device__ __forceinline__ void imma_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                           uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// An int8 key codebook in registers: byte k of c[w] = int8 level 4w + k.
struct Codebook8 {
  uint32_t c[4];
};

/// Four codes (nibbles 0..3 of s; for B < 4 the bits above B are zero) ->
/// their four int8 levels, one byte each (one prmt for ≤ 8 levels; 16 levels:
/// two halves picked per byte by code bit 3, as nibbles_to_half2).
template <int B>
__device__ __forceinline__ uint32_t decode4_i8(uint32_t s, const Codebook8& cb) {
  if constexpr (B < 4) {
    return prmt(cb.c[0], cb.c[1], s);
  } else {
    const uint32_t s7 = s & 0x7777u;
    const uint32_t m = prmt(s << 4, s, 0xD9C8u);
    return (prmt(cb.c[0], cb.c[1], s7) & ~m) | (prmt(cb.c[2], cb.c[3], s7) & m);
  }
}

/// Shared memory of a CTA: the warps' mbarriers, the rotated query as int8 B
/// fragments [D/32][32] uint4 (b0, b1 of the hi part, then of the lo part;
/// lane (g, t): b0 = row g's channels 2t, 2t+1, 2t+8, 2t+9 of tile 2j, b1 the
/// same of tile 2j+1), then each warp's kStages page stages.
constexpr size_t kBarBytes = 128;  // ≥ 8 warps × kStages mbarriers, keeps what follows aligned
static_assert(kBarBytes >= 8 * kStages * sizeof(uint64_t));
template <int D>
constexpr size_t kQfragBytes = (size_t)(D / 32) * 32 * sizeof(uint4);

/// D: head_dim; UB: the plan's width (bits of every key and value code).
template <int D, int UB>
__global__ void __launch_bounds__(32 * kWarps<D>, 2) uniform_decode_kernel(
    const HeadTables* __restrict__ tables, const uint8_t* __restrict__ pool, size_t page_bytes,
    const int32_t* __restrict__ page_table, int max_pages, const int32_t* __restrict__ seq_lens,
    int pages_per_split, int n_heads, int gqa, const __half* __restrict__ qrot, Partials part) {
  constexpr int NT = D / 16;               // 16-channel tiles per side
  constexpr int kSideCodeBytes = NT * UB * 128;  // one side's codes in the head block
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  uint4* qfrag = reinterpret_cast<uint4*>(smem + kBarBytes);
  const int h = blockIdx.y, b = blockIdx.z;
  const int row_base = b * n_heads + h * gqa;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x * kWarps<D> + warp;
  const HeadTables& T = tables[h];
  const int stage_bytes = T.stage_bytes;
  uint8_t* stages = smem + kBarBytes + kQfragBytes<D> + (size_t)warp * kStages * stage_bytes;
  uint64_t* bar = bars + warp * kStages;
  const int len = seq_lens[b];
  const int n_pages_seq = (len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int page_lo = split * pages_per_split;
  const int page_hi = split < part.n_splits ? min(page_lo + pages_per_split, n_pages_seq) : page_lo;
  const int32_t* pt = page_table + (size_t)b * max_pages;
  const uint8_t* head_base = pool + T.block_offset;
  auto issue = [&](int page, int stage) {
    if (lane == 0) {
      mbarrier_expect_tx(&bar[stage], (uint32_t)stage_bytes);
      bulk_copy_g2s(stages + stage * stage_bytes, head_base + (size_t)pt[page] * page_bytes,
                    (uint32_t)stage_bytes, &bar[stage]);
    }
  };
  // The warp's first page goes out before the CTA-wide prologue.
  if (lane == 0) {
    mbarrier_init(&bar[0], 1);
    mbarrier_init(&bar[1], 1);
    fence_mbarrier_init();
  }
  __syncwarp();
  if (page_lo < page_hi) issue(page_lo, 0);
  // Rotated query (fp16, written by the rotation kernel, which this launch may
  // overlap: PDL) as two-part int8 B fragments: per row r, s_r = max|q̃_r|/127
  // (1 for a zero row, e.g. rows ≥ gqa), q̃/s_r = hi + lo/254 with
  // hi = round(q̃/s_r) and lo = round((q̃/s_r − hi)·254), both in [−127, 127].
  grid_dependency_wait();
  __shared__ float q_scale[8];
  for (int r = warp; r < 8; r += kWarps<D>) {
    float mx = 0.f;
    if (r < gqa)
      for (int c = lane; c < D; c += 32)
        mx = fmaxf(mx, fabsf(__half2float(qrot[(size_t)(row_base + r) * kMaxTiles * 16 + c])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) q_scale[r] = mx > 0.f ? mx / 127.f : 1.f;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < NT / 2 * 32; i += blockDim.x) {
    const int j = i >> 5, ln = i & 31, qg = ln >> 2, qt = ln & 3;
    uint32_t hi[2] = {0u, 0u}, lo[2] = {0u, 0u};
    if (qg < gqa) {
      const float inv = 1.f / q_scale[qg];
      const __half* r = qrot + (size_t)(row_base + qg) * kMaxTiles * 16;
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // k index 4qt + e <-> channel 2qt + (e & 1) + 8·(e >> 1)
          const int c = (2 * j + u) * 16 + 2 * qt + (e & 1) + 8 * (e >> 1);
          const float x = __half2float(r[c]) * inv;  // |x| ≤ 127
          const float xh = rintf(x);
          const int ih = (int)xh, il = (int)rintf((x - xh) * 254.f);
          hi[u] |= (uint32_t)(ih & 0xff) << (8 * e);
          lo[u] |= (uint32_t)(il & 0xff) << (8 * e);
        }
    }
    qfrag[i] = make_uint4(hi[0], hi[1], lo[0], lo[1]);
  }
  Codebook8 cbK;
#pragma unroll
  for (int w = 0; w < 4; ++w) cbK.c[w] = T.i8tab[0][w];
  Codebook cbV;
  load_codebook(T.ptab[1][0], UB, cbV);
  const int norm_k = T.norm_offset[0][0], norm_v = T.norm_offset[1][0];
  __syncthreads();
  // Softmax exponent per integer score unit, rows 2t, 2t+1: log2 e · s_r · s_L / 254.
  const float sl = T.i8scale[0] / 254.f * kLog2e;
  const float kexp[2] = {q_scale[2 * t] * sl, q_scale[2 * t + 1] * sl};
  if (split >= part.n_splits) return;
  if (page_lo >= page_hi) {
    store_empty(part, row_base, gqa, split);
    return;
  }

  float O[NT][4];  // Oᵀ: (channel 16vt + g (+8 for [2], [3]), row 2t + (i & 1))
#pragma unroll
  for (int vt = 0; vt < NT; ++vt)
#pragma unroll
    for (int i = 0; i < 4; ++i) O[vt][i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units), rows 2t, 2t+1
  float l[2] = {0.f, 0.f};              // this lane's partial row sums

  for (int pg = page_lo; pg < page_hi; ++pg) {
    const int k = pg - page_lo, stage = k & 1;
    if (pg + 1 < page_hi) issue(pg + 1, stage ^ 1);
    mbarrier_wait(&bar[stage], (uint32_t)(k >> 1) & 1u);
    const uint8_t* sb = stages + stage * stage_bytes;
    const int valid = len - pg * packed::kPageTokens;  // tokens of this page in use (may be > 64)

    // ---- Sᵀ = K · Q̃ᵀ per token tile; S[tt]: (token 16tt + g (+8 for [2], [3]), row 2t + (i & 1))
    // In int32 (hi and lo query parts, S = 254·hi + lo; |S| < 2^31 for D ≤ 256).
    // Channel tiles 2j, 2j+1 make one k = 32 step: A = their codes of token g
    // (g+8), 4 per register, in the order of code_nibbles.
    float S[4][4];
    {
      int Sh[4][4], Sl[4][4];
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) Sh[tt][i] = Sl[tt][i] = 0;
#pragma unroll
      for (int j = 0; j < NT / 2; ++j) {
        const uint32_t* rows0 = reinterpret_cast<const uint32_t*>(sb + 2 * j * UB * 128) + lane;
        const uint32_t* rows1 = rows0 + UB * 32;
        uint32_t w0[4], w1[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          w0[k] = k < UB ? rows0[32 * k] : 0u;
          w1[k] = k < UB ? rows1[32 * k] : 0u;
        }
        const uint4 q = qfrag[j * 32 + lane];
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          const uint32_t na = code_nibbles<UB>(w0, UB, tt), nb = code_nibbles<UB>(w1, UB, tt);
          const uint32_t a[4] = {decode4_i8<UB>(na, cbK), decode4_i8<UB>(na >> 16, cbK),
                                 decode4_i8<UB>(nb, cbK), decode4_i8<UB>(nb >> 16, cbK)};
          imma_16832(Sh[tt], a, q.x, q.y);
          imma_16832(Sl[tt], a, q.z, q.w);
        }
      }
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) S[tt][i] = (float)(Sh[tt][i] * 254 + Sl[tt][i]);
    }
    // Key norms (one group: S = n^K ∘ (Q̃·Cᵀ)); tokens past the sequence -> −∞.
    const __half* nk = reinterpret_cast<const __half*>(sb + norm_k);
#pragma unroll
    for (int tt = 0; tt < 4; ++tt) {
      const float n0 = __half2float(nk[16 * tt + g]), n1 = __half2float(nk[16 * tt + g + 8]);
      S[tt][0] *= n0;
      S[tt][1] *= n0;
      S[tt][2] *= n1;
      S[tt][3] *= n1;
    }
    if (valid < packed::kPageTokens) {  // warp-uniform: only a sequence's last page
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (16 * tt + g + 8 * (i >> 1) >= valid) S[tt][i] = -INFINITY;
    }
    // ---- online softmax, rows 2t + r: this lane's 8 tokens, then over g
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) mx = fmaxf(mx, fmaxf(S[tt][r], S[tt][r + 2]));
      mx *= kexp[r];
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(m[r], mx);  // finite: every page has a valid token
      alpha[r] = fast_exp2(m[r] - m_new);
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int i = r; i < 4; i += 2) {
          const float p = fast_exp2(fmaf(S[tt][i], kexp[r], -m_new));
          S[tt][i] = p;
          sum += p;
        }
      l[r] = l[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      O[vt][0] *= alpha[0];
      O[vt][1] *= alpha[1];
      O[vt][2] *= alpha[0];
      O[vt][3] *= alpha[1];
    }
    // ---- (P ∘ n^V)ᵀ as B fragments: (tokens 2t, 2t+1 (+8), row g) via 8×8 transposes
    const __half* nv = reinterpret_cast<const __half*>(sb + norm_v);
    uint32_t pb[4][2];
#pragma unroll
    for (int tt = 0; tt < 4; ++tt) {
      float v0 = __half2float(nv[16 * tt + g]), v1 = __half2float(nv[16 * tt + g + 8]);
      if (valid < packed::kPageTokens) {  // unwritten slots may hold NaN norms
        if (16 * tt + g >= valid) v0 = 0.f;
        if (16 * tt + g + 8 >= valid) v1 = 0.f;
      }
      pb[tt][0] = transpose_8x8(pack_half2(S[tt][0] * v0, S[tt][1] * v0));
      pb[tt][1] = transpose_8x8(pack_half2(S[tt][2] * v1, S[tt][3] * v1));
    }
    // ---- Oᵀ += V_tileᵀ · (P ∘ n^V)ᵀ per value tile
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      const uint32_t* rows =
          reinterpret_cast<const uint32_t*>(sb + kSideCodeBytes + vt * UB * 128) + lane;
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = j < UB ? rows[32 * j] : 0u;
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        uint32_t f[2][2];
        decode_fragments<UB>(code_nibbles<UB>(w, UB, tt), UB, cbV, f);
        const uint32_t a[4] = {f[0][0], f[1][0], f[0][1], f[1][1]};
        mma_16816(O[vt], a, pb[tt][0], pb[tt][1]);
      }
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  allow_dependent_launch();  // the merge may start its prologue (it waits for all CTAs)

  // ---- split state: rows 2t + r < gqa; l summed over the lanes of the row (g)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 4);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 8);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 16);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 2 * t + r;
    if (row >= gqa) continue;
    const size_t idx = (size_t)(row_base + row) * part.n_splits + split;
    if (g == 0) {
      part.m[idx] = m[r];
      part.l[idx] = l[r];
    }
    float* o = part.o + idx * part.o_dim;
#pragma unroll
    for (int vt = 0; vt < NT; ++vt) {
      o[vt * 16 + g] = O[vt][r];
      o[vt * 16 + g + 8] = O[vt][r + 2];
    }
  }
}

template <int D, int UB>
void launch(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
            const WorkspaceView& w, int pages_per_split, cudaStream_t stream) {
  const auto& dev = plan.device();
  const size_t smem = kBarBytes + kQfragBytes<D> + (size_t)kWarps<D> * kStages * dev.max_stage_bytes;
  static int smem_set[kMaxDevices] = {};
  set_smem_limit(reinterpret_cast<const void*>(uniform_decode_kernel<D, UB>), smem, smem_set);
  const dim3 grid((w.part.n_splits + kWarps<D> - 1) / kWarps<D>, plan.layout().n_kv_heads(), batch.batch);
  launch_pdl(uniform_decode_kernel<D, UB>, grid, dim3(32 * kWarps<D>), smem, stream, dev.heads, pool,
             plan.layout().page_bytes(), batch.page_table, batch.max_pages, batch.seq_lens,
             pages_per_split, plan.n_heads(), plan.gqa(), (const __half*)w.q, w.part);
}

template <int D>
void launch_bits(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                 const WorkspaceView& w, int pps, cudaStream_t stream) {
  switch (plan.device().uniform_bits) {
    case 1: return launch<D, 1>(plan, batch, pool, w, pps, stream);
    case 2: return launch<D, 2>(plan, batch, pool, w, pps, stream);
    case 3: return launch<D, 3>(plan, batch, pool, w, pps, stream);
    case 4: return launch<D, 4>(plan, batch, pool, w, pps, stream);
    default:
      throw_error(cat("uniform decode attention: plan width ", plan.device().uniform_bits,
                      " has no uniform kernel (1..4)"));
  }
}

}  // namespace

void launch_uniform_decode(const PackedPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                           const WorkspaceView& w, int pages_per_split, cudaStream_t stream) {
  require(plan.gqa() <= 8, "uniform decode attention: GQA ", plan.gqa(), " > 8");
  require(plan.device().max_stage_bytes % 16 == 0,
          "uniform decode attention: head block of ", plan.device().max_stage_bytes,
          " bytes is not a multiple of 16 (bulk copy)");
  switch (plan.head_dim()) {
    case 64: return launch_bits<64>(plan, batch, pool, w, pages_per_split, stream);
    case 128: return launch_bits<128>(plan, batch, pool, w, pages_per_split, stream);
    case 256: return launch_bits<256>(plan, batch, pool, w, pages_per_split, stream);
    default:
      throw_error(cat("uniform decode attention: head_dim ", plan.head_dim(),
                      " has no kernel (64, 128, 256)"));
  }
}

}  // namespace ratekv::cuda::detail
