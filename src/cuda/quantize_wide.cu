// packed_write_wide / packed_dequantize_wide (ratekv/cuda/packed_wide.h):
// plans with 5..8-bit groups, whose high bits live in the extension pages
// (docs/packed_format.md §5). The writer is packed_append's quantizer
// (quantize_append.cu) per token, with the code taken over the group's 2^b
// levels and split into the page's nibble and the extension page's high bits.
#include "attention_common.cuh"
#include "ratekv/cuda/packed_wide.h"

namespace ratekv::cuda {

using detail::HeadTables;
using detail::WideTables;

namespace {

// Sets the `bits` low bits of `code` for element (slot, coordinate j) of a
// code segment (bit placement of docs/packed_format.md §3).
__device__ void put_code(uint8_t* seg, int bits, int s, int slot, int j, uint32_t code) {
  const int r = slot % 16, tt = slot / 16, c = j % 16, ct = j / 16;
  const int rr = s == 0 ? r : c, cc = s == 0 ? c : r;
  const int elane = 4 * (rr % 8) + (cc % 8) / 2, e = 4 * (rr / 8) + 2 * (cc / 8) + cc % 2;
  for (int p = 0; p < bits; ++p) {
    const packed::CodeBitPos at = packed::code_bit_pos(bits, tt, e, p);
    uint32_t* word = reinterpret_cast<uint32_t*>(seg + ((size_t)(ct * bits + at.word) * packed::kWarpLanes + elane) * 4);
    const uint32_t mask = 1u << at.bit;
    if ((code >> p) & 1u)
      atomicOr(word, mask);
    else
      atomicAnd(word, ~mask);
  }
}

__global__ void __launch_bounds__(256) wide_write_kernel(
    const HeadTables* __restrict__ tables, const WideTables* __restrict__ wide, const float* __restrict__ rot,
    const int32_t* __restrict__ chans, const float* __restrict__ levels, uint8_t* __restrict__ pool,
    size_t page_bytes, uint8_t* __restrict__ ext_pool, size_t ext_page_bytes, const int32_t* __restrict__ page_table,
    int max_pages, const int32_t* __restrict__ seq_lens, const float* __restrict__ k, const float* __restrict__ v,
    int n_tokens, int head_dim) {
  __shared__ float xw[256];
  __shared__ float ys[256];
  __shared__ float red[8];
  const int row = blockIdx.x, h = blockIdx.y, s = blockIdx.z, Hkv = gridDim.y;
  const int b = row / n_tokens, i = row % n_tokens;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const HeadTables& T = tables[h];
  const WideTables& W = wide[h];
  const float* x = (s == 0 ? k : v) + ((size_t)row * Hkv + h) * head_dim;
  const int pos = seq_lens[b] + i;
  const int slot = pos % packed::kPageTokens;
  const int32_t page = page_table[(size_t)b * max_pages + pos / packed::kPageTokens];
  uint8_t* base = pool + (size_t)page * page_bytes + T.block_offset;
  uint8_t* ext_base = ext_pool + (size_t)page * ext_page_bytes;
  for (int g = 0; g < T.n_groups[s]; ++g) {
    const int dim = T.dim[s][g], dim_pad = T.dim_pad[s][g], bits = T.bits[s][g];
    const int wb = W.wide_bits[s][g], cbits = wb > 0 ? wb : bits;  // the code's full width
    const float* R = rot + T.rot_offset[s][g];
    const int32_t* ch = chans + T.chan_offset[s][g];
    const float* lv = levels + T.lvl_offset[s][g];
    __syncthreads();  // previous group done with xw, ys, red
    float ss = 0.f;
    if (tid < dim) {
      const float xi = x[ch[tid]];
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
    for (int j = warp; j < dim; j += 8) {  // y_j: one warp per row j of Π_g
      float acc = 0.f;
      for (int q = lane; q < dim; q += 32) acc = fmaf(R[(size_t)j * dim + q], xw[q], acc);
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
        for (int l = 0; l + 1 < (1 << cbits); ++l) code += y > 0.5f * (lv[l] + lv[l + 1]) ? 1u : 0u;
      }
      put_code(base + T.code_offset[s][g], bits, s, slot, j, code & 0xFu);
      if (wb > 0) put_code(ext_base + W.ext_code_offset[s][g], wb - packed::kMaxBits, s, slot, j, code >> 4);
    }
    if (tid == 0) *reinterpret_cast<__half*>(base + T.norm_offset[s][g] + 2 * slot) = __float2half_rn(n);
  }
}

__global__ void __launch_bounds__(128) wide_dequant_kernel(
    const HeadTables* __restrict__ tables, const WideTables* __restrict__ wide, const float* __restrict__ rot,
    const int32_t* __restrict__ chans, const float* __restrict__ levels, const uint8_t* __restrict__ pool,
    size_t page_bytes, const uint8_t* __restrict__ ext_pool, size_t ext_page_bytes,
    const int32_t* __restrict__ page_table, int hd, uint16_t* __restrict__ k16, uint16_t* __restrict__ v16) {
  __shared__ float y[256];
  const int t = blockIdx.x, h = blockIdx.y, s = blockIdx.z, Hkv = gridDim.y;
  const HeadTables& T = tables[h];
  const WideTables& W = wide[h];
  uint16_t* o = (s == 0 ? k16 : v16) + ((size_t)t * Hkv + h) * hd;
  const int slot = t % packed::kPageTokens;
  const int32_t page = page_table[t / packed::kPageTokens];
  const uint8_t* head = pool + (size_t)page * page_bytes + T.block_offset;
  const uint8_t* ext = ext_pool + (size_t)page * ext_page_bytes;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) o[c] = 0;  // channels in no group
  for (int g = 0; g < T.n_groups[s]; ++g) {
    const int dim = T.dim[s][g], wb = W.wide_bits[s][g];
    const float* lv = levels + T.lvl_offset[s][g];
    const float norm = __half2float(*reinterpret_cast<const __half*>(head + T.norm_offset[s][g] + 2 * slot));
    __syncthreads();  // y free (and the zeros written before any group's channels)
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
      uint32_t code = detail::read_code(head + T.code_offset[s][g], T.bits[s][g], s, slot, j);
      if (wb > 0) code |= detail::read_code(ext + W.ext_code_offset[s][g], wb - packed::kMaxBits, s, slot, j) << 4;
      y[j] = norm * lv[code];
    }
    __syncthreads();
    const float* R = rot + T.rot_offset[s][g];
    const int32_t* ch = chans + T.chan_offset[s][g];
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {  // x̂_c = Σ_j Π[j][c] · y_j
      float acc = 0.f;
      for (int j = 0; j < dim; ++j) acc = fmaf(R[(size_t)j * dim + c], y[j], acc);
      o[ch[c]] = __half_as_ushort(__float2half_rn(acc));
    }
  }
}

void require_wide(const PackedPlan& plan, const char* what) {
  detail::require(plan.device().has_wide && plan.ext_layout() != nullptr, what,
                  ": the plan has no 5..8-bit group (packed_append / packed_prefill / packed_dequantize serve it)");
}

}  // namespace

void packed_write_wide(const PackedPlan& plan, const DecodeBatch& batch, uint8_t* pool, uint8_t* ext_pool,
                       const float* k, const float* v, int n_tokens, void* stream) {
  require_wide(plan, "packed_write_wide");
  detail::require(batch.batch > 0 && batch.page_table && batch.seq_lens,
                  "packed_write_wide: a batch of ≥ 1 sequences with page_table and seq_lens device pointers");
  detail::require(n_tokens >= 1, "packed_write_wide: n_tokens ", n_tokens, " must be at least 1");
  detail::require(pool && ext_pool && k && v, "packed_write_wide: pool, ext_pool, k and v must be device pointers");
  const int d = plan.head_dim();
  detail::require(d <= 256, "packed_write_wide: head_dim ", d, " > 256 unsupported");
  const auto& D = plan.device();
  const dim3 grid((unsigned)batch.batch * (unsigned)n_tokens, plan.layout().n_kv_heads(), 2);
  wide_write_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      D.heads, D.wide, D.rotations, D.channels, D.levels, pool, plan.layout().page_bytes(), ext_pool,
      plan.ext_layout()->page_bytes(), batch.page_table, batch.max_pages, batch.seq_lens, k, v, n_tokens, d);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

void packed_dequantize_wide(const PackedPlan& plan, const uint8_t* pool, const uint8_t* ext_pool,
                            const int32_t* page_table, int n_tokens, uint16_t* k16, uint16_t* v16, void* stream) {
  require_wide(plan, "packed_dequantize_wide");
  detail::require(pool && ext_pool && page_table && k16 && v16 && n_tokens > 0,
                  "packed_dequantize_wide: pool, ext_pool, page_table, k16, v16 must be device pointers and n_tokens "
                  "≥ 1");
  const int d = plan.head_dim();
  detail::require(d <= 256, "packed_dequantize_wide: head_dim ", d, " > 256 unsupported");
  const auto& D = plan.device();
  wide_dequant_kernel<<<dim3(n_tokens, plan.layout().n_kv_heads(), 2), 128, 0, static_cast<cudaStream_t>(stream)>>>(
      D.heads, D.wide, D.rotations, D.channels, D.levels, pool, plan.layout().page_bytes(), ext_pool,
      plan.ext_layout()->page_bytes(), page_table, d, k16, v16);
  RATEKV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ratekv::cuda
