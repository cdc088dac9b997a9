// The GPU engine's own kernels (ratekv/cuda/model_kernels.h).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "attention_common.cuh"
#include "ratekv/cuda/model_kernels.h"
#include "ratekv/model/synthetic.h"

namespace ratekv::cuda {

using detail::require;

namespace {

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const __nv_bfloat16 b = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&b);
}
__device__ __forceinline__ float bf16_val(uint16_t u) {
  return __uint_as_float((uint32_t)u << 16);
}
__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

int blocks_for(int64_t n, int threads, int cap = 65536) {
  const int64_t b = (n + threads - 1) / threads;
  return (int)(b < cap ? (b > 0 ? b : 1) : cap);
}

__global__ void synth_bf16_kernel(uint16_t* out, int64_t n, uint64_t seed, uint32_t tensor, int kind, int amp_exp,
                                  uint64_t index0) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = bf16_bits(synthetic_value(seed, tensor, index0 + (uint64_t)i, (SyntheticKind)kind, amp_exp));
}
__global__ void synth_f32_kernel(float* out, int64_t n, uint64_t seed, uint32_t tensor, int kind, int amp_exp,
                                 uint64_t index0) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = synthetic_value(seed, tensor, index0 + (uint64_t)i, (SyntheticKind)kind, amp_exp);
}
__global__ void f32_to_bf16_kernel(const float* __restrict__ in, uint16_t* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = bf16_bits(in[i]);
}

__global__ void embed_kernel(const uint16_t* __restrict__ table, const int32_t* __restrict__ tokens, int d,
                             float scale, float* __restrict__ x) {
  const int i = blockIdx.x;
  const uint16_t* row = table + (size_t)tokens[i] * d;
  if (scale == 1.f) {
    for (int c = threadIdx.x; c < d; c += blockDim.x) x[(size_t)i * d + c] = bf16_val(row[c]);
  } else {
    for (int c = threadIdx.x; c < d; c += blockDim.x) x[(size_t)i * d + c] = bf16_val(row[c]) * scale;
  }
}

// One block per row; Σx² in double (the CPU runtime's rms_norm).
__global__ void __launch_bounds__(256) add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ delta,
                                                           const float* __restrict__ w, int d, float eps,
                                                           uint16_t* __restrict__ out) {
  __shared__ double red[8];
  __shared__ float r_sh;
  float* xr = x + (size_t)blockIdx.x * d;
  const float* dr = delta ? delta + (size_t)blockIdx.x * d : nullptr;
  double ss = 0;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float v = xr[c];
    if (dr) {
      v += dr[c];
      xr[c] = v;
    }
    ss += (double)v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) s += red[i];
    r_sh = (float)(1.0 / sqrt(s / d + (double)eps));
  }
  __syncthreads();
  const float r = r_sh;
  uint16_t* o = out + (size_t)blockIdx.x * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = bf16_bits(xr[c] * r * w[c]);
}

// One block per row, in place or not: out[i] = x[i] · r · w in fp32 with Σx²
// in double (post-norms: ratekv::rms_norm on the attention / FFN output).
__global__ void __launch_bounds__(256) rms_norm_f32_kernel(const float* x, const float* __restrict__ w, int d,
                                                           float eps, float* out) {  // x may be out: no __restrict__
  __shared__ double red[8];
  __shared__ float r_sh;
  const float* xr = x + (size_t)blockIdx.x * d;
  double ss = 0;
  for (int c = threadIdx.x; c < d; c += blockDim.x) ss += (double)xr[c] * xr[c];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); ++i) s += red[i];
    r_sh = (float)(1.0 / sqrt(s / d + (double)eps));
  }
  __syncthreads();
  const float r = r_sh;
  float* o = out + (size_t)blockIdx.x * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = xr[c] * r * w[c];
}

// One block per token; thread per (head, pair) of Q and K, plain copies of V.
// With QK-norm (qn, kn non-null) the block first computes each Q/K head's
// 1/rms (after the bias; Σx² in double) into shared memory (dynamic, H + Hkv
// floats).
__global__ void qkv_rope_kernel(const float* __restrict__ qkv, const float* __restrict__ bias,
                                const int32_t* __restrict__ pos, int H, int Hkv, int hd, bool neox,
                                const double* __restrict__ inv_freq, const float* __restrict__ qn,
                                const float* __restrict__ kn, float eps, QkvRopeOut o) {
  extern __shared__ float head_r[];  // (H + Hkv) 1/rms factors (QK-norm only)
  const int i = blockIdx.x, half = hd / 2;
  const int qd = H * hd, kvd = Hkv * hd;
  const float* row = qkv + (size_t)i * (qd + 2 * kvd);
  const double p = (double)pos[i];
  if (qn) {  // one warp per head: ratekv::rms_norm over the head's channels
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int head = warp; head < H + Hkv; head += nw) {
      double ss = 0;
      for (int c = lane; c < hd; c += 32) {
        float x = row[head * hd + c];
        if (bias) x += bias[head * hd + c];
        ss += (double)x * x;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      if (lane == 0) head_r[head] = (float)(1.0 / sqrt(ss / hd + (double)eps));
    }
    __syncthreads();
  }
  // Q and K pairs: (H + Hkv) heads × half pairs.
  for (int idx = threadIdx.x; idx < (H + Hkv) * half; idx += blockDim.x) {
    const int head = idx / half, j = idx % half;
    const int a = neox ? j : 2 * j, bch = neox ? j + half : 2 * j + 1;
    const int base = head * hd;  // Q heads then K heads are consecutive in qkv
    float xa = row[base + a], xb = row[base + bch];
    if (bias) {
      xa += bias[base + a];
      xb += bias[base + bch];
    }
    if (qn) {  // QK-norm before RoPE: x · r · w (the CPU's order)
      const float r = head_r[head];
      const float* w = head < H ? qn : kn;
      xa = xa * r * w[a];
      xb = xb * r * w[bch];
    }
    double sd, cd;
    sincos(p * inv_freq[j], &sd, &cd);
    const float c = (float)cd, s = (float)sd;
    const float ya = xa * c - xb * s, yb = xa * s + xb * c;
    if (head < H) {
      const size_t q0 = (size_t)i * qd + base;
      if (o.q32) {
        o.q32[q0 + a] = ya;
        o.q32[q0 + bch] = yb;
      }
      if (o.q16) {
        o.q16[q0 + a] = f16_bits(ya);
        o.q16[q0 + bch] = f16_bits(yb);
      }
    } else {
      const size_t k0 = (size_t)i * kvd + (base - qd);
      if (o.k_pre32) {
        o.k_pre32[k0 + a] = xa;
        o.k_pre32[k0 + bch] = xb;
      }
      if (o.k32) {
        o.k32[k0 + a] = ya;
        o.k32[k0 + bch] = yb;
      }
      if (o.k16) {
        o.k16[k0 + a] = f16_bits(ya);
        o.k16[k0 + bch] = f16_bits(yb);
      }
    }
  }
  for (int c = threadIdx.x; c < kvd; c += blockDim.x) {
    float v = row[qd + kvd + c];
    if (bias) v += bias[qd + kvd + c];
    if (o.v32) o.v32[(size_t)i * kvd + c] = v;
    if (o.v16) o.v16[(size_t)i * kvd + c] = f16_bits(v);
  }
}

__global__ void swiglu_kernel(const float* __restrict__ gu, int64_t n, int dff, uint16_t* __restrict__ out) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n * dff;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = idx / dff, j = idx % dff;
    const float g = gu[i * 2 * dff + j], u = gu[i * 2 * dff + dff + j];
    out[idx] = bf16_bits(g / (1.0f + expf(-g)) * u);
  }
}

// GeGLU: GELU's tanh approximation of the gate times the up projection (the
// CPU runtime's gelu_tanh, fp32).
__global__ void geglu_kernel(const float* __restrict__ gu, int64_t n, int dff, uint16_t* __restrict__ out) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f, kCoef = 0.044715f;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n * dff;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = idx / dff, j = idx % dff;
    const float g = gu[i * 2 * dff + j], u = gu[i * 2 * dff + dff + j];
    out[idx] = bf16_bits(0.5f * g * (1.0f + tanhf(kSqrt2OverPi * g * (1.0f + kCoef * g * g))) * u);
  }
}

__global__ void softcap_kernel(float* __restrict__ x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void __launch_bounds__(1024) argmax_kernel(const float* __restrict__ logits, int V,
                                                      int32_t* __restrict__ out) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  const float* row = logits + (size_t)blockIdx.x * V;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = row[j];
    if (v > best) best = v, idx = j;  // j increases: ties keep the first
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > best || (ov == best && oi < idx)) best = ov, idx = oi;
  }
  if ((threadIdx.x & 31) == 0) bv[threadIdx.x >> 5] = best, bi[threadIdx.x >> 5] = idx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
      if (bv[w] > best || (bv[w] == best && bi[w] < idx)) best = bv[w], idx = bi[w];
    out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;  // an all-NaN row: token 0
  }
}

// One block per (matrix, row).
__global__ void __launch_bounds__(256) causal_softmax_kernel(const float* __restrict__ S, int64_t stride, int rows,
                                                             int cols, int r0, int window, float scale,
                                                             uint16_t* __restrict__ P) {
  __shared__ float red[8];
  __shared__ float bc;
  const int row = blockIdx.x % rows, b = blockIdx.x / rows;
  const float* s = S + b * stride + (size_t)row * cols;
  uint16_t* p = P + b * stride + (size_t)row * cols;
  const int lim = min(cols, r0 + row + 1);
  const int lo = window > 0 ? max(0, r0 + row - window + 1) : 0;  // sliding window: columns lo .. lim−1
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float mx = -INFINITY;
  for (int j = lo + threadIdx.x; j < lim; j += blockDim.x) mx = fmaxf(mx, s[j] * scale);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    float v = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) v = fmaxf(v, red[w]);
    bc = v;
  }
  __syncthreads();
  const float m = bc;
  float sum = 0.f;
  for (int j = lo + threadIdx.x; j < lim; j += blockDim.x) sum += expf(s[j] * scale - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float v = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) v += red[w];
    bc = 1.f / v;
  }
  __syncthreads();
  const float inv = bc;
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    p[j] = j < lim && j >= lo ? f16_bits(expf(s[j] * scale - m) * inv) : (uint16_t)0;
}

// Grid (n_tokens, batch); every K and V element of the token's KV heads.
__global__ void fp16_write_kernel(uint16_t* __restrict__ pool, int Hkv, int hd, const int32_t* __restrict__ page_table,
                                  int max_pages, const int32_t* __restrict__ start, const float* __restrict__ k,
                                  const float* __restrict__ v, int n_tokens) {
  const int i = blockIdx.x, b = blockIdx.y;
  const int pos = start[b] + i;
  const size_t page = (size_t)page_table[(size_t)b * max_pages + pos / packed::kPageTokens];
  const size_t page_elems = (size_t)Hkv * 2 * packed::kPageTokens * hd;
  const int slot = pos % packed::kPageTokens, kvd = Hkv * hd;
  const size_t src = ((size_t)b * n_tokens + i) * kvd;
  for (int idx = threadIdx.x; idx < 2 * kvd; idx += blockDim.x) {
    const int side = idx / kvd, r = idx % kvd, h = r / hd, c = r % hd;
    const float val = side == 0 ? k[src + r] : v[src + r];
    pool[page * page_elems + ((size_t)h * 2 + side) * packed::kPageTokens * hd + (size_t)slot * hd + c] = f16_bits(val);
  }
}

// Grid (n_tokens); positions 0..n_tokens−1 of one sequence's fp16 pages.
__global__ void fp16_read_kernel(const uint16_t* __restrict__ pool, int Hkv, int hd,
                                 const int32_t* __restrict__ page_table, uint16_t* __restrict__ k16,
                                 uint16_t* __restrict__ v16) {
  const int i = blockIdx.x;
  const size_t page = (size_t)page_table[i / packed::kPageTokens];
  const size_t page_elems = (size_t)Hkv * 2 * packed::kPageTokens * hd;
  const int slot = i % packed::kPageTokens, kvd = Hkv * hd;
  for (int idx = threadIdx.x; idx < 2 * kvd; idx += blockDim.x) {
    const int side = idx / kvd, r = idx % kvd, h = r / hd, c = r % hd;
    const uint16_t val =
        pool[page * page_elems + ((size_t)h * 2 + side) * packed::kPageTokens * hd + (size_t)slot * hd + c];
    (side == 0 ? k16 : v16)[(size_t)i * kvd + r] = val;
  }
}

// One block per (head, query row) of a key tile: the online-softmax update of
// prefill_tile_softmax (model_kernels.h).
__global__ void __launch_bounds__(256) tile_softmax_kernel(const float* __restrict__ S, int64_t stride, int rows,
                                                           int cols, int q0, int t0, int window, float scale,
                                                           float* __restrict__ M,
                                                           float* __restrict__ L, float* __restrict__ O, int64_t o_ld,
                                                           int hd, int first, uint16_t* __restrict__ P) {
  __shared__ float red[8];
  __shared__ float bc;
  const int row = blockIdx.x % rows, h = blockIdx.x / rows, H = gridDim.x / rows;
  const float* s = S + h * stride + (size_t)row * cols;
  uint16_t* p = P + h * stride + (size_t)row * cols;
  // Keys at absolute positions t0 + j ≤ q0 + row are visible (and, with a
  // sliding window, t0 + j > q0 + row − window): columns lo .. lim−1.
  const int lo = window > 0 ? min(cols, max(0, q0 + row - window + 1 - t0)) : 0;
  const int lim = max(lo, min(cols, q0 + row - t0 + 1));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const size_t st = (size_t)row * H + h;
  const float m_old = first ? -INFINITY : M[st];
  float* o = O + (size_t)row * o_ld + (size_t)h * hd;
  if (lim == lo) {  // the whole tile lies in this row's future (or before its window)
    for (int j = threadIdx.x; j < cols; j += blockDim.x) p[j] = 0;
    if (first) {
      for (int c = threadIdx.x; c < hd; c += blockDim.x) o[c] = 0.f;
      if (threadIdx.x == 0) M[st] = -INFINITY, L[st] = 0.f;
    }
    return;
  }
  float mx = -INFINITY;
  for (int j = lo + threadIdx.x; j < lim; j += blockDim.x) mx = fmaxf(mx, s[j] * scale);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    float v = m_old;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) v = fmaxf(v, red[w]);
    bc = v;
  }
  __syncthreads();
  const float m = bc;
  float sum = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = j < lim && j >= lo ? expf(s[j] * scale - m) : 0.f;
    const uint16_t b = f16_bits(e);
    p[j] = b;
    sum += __half2float(__ushort_as_half(b));  // the probabilities the P·V product uses
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  const float alpha = m_old == -INFINITY ? 0.f : expf(m_old - m);
  for (int c = threadIdx.x; c < hd; c += blockDim.x) o[c] = alpha == 0.f ? 0.f : o[c] * alpha;
  if (threadIdx.x == 0) {
    float v = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) v += red[w];
    L[st] = (first ? 0.f : L[st] * alpha) + v;
    M[st] = m;
  }
}

__global__ void normalize_rows_kernel(float* __restrict__ O, int64_t o_ld, int H, int hd,
                                      const float* __restrict__ L) {
  const int row = blockIdx.x;
  for (int i = threadIdx.x; i < H * hd; i += blockDim.x) {
    const float l = L[(size_t)row * H + i / hd];
    O[(size_t)row * o_ld + i] = l > 0.f ? O[(size_t)row * o_ld + i] / l : 0.f;
  }
}

// ---- sampling (ratekv/engine/sampling.h's definition) -----------------------

__device__ __forceinline__ uint32_t order_key(float f) {  // monotone float → uint32 (NaN: handled by the caller)
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block-wide reductions for sample_kernel (1024 threads).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T a = sh[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) a = op(a, sh[w]);
    sh[0] = a;
  }
  __syncthreads();
  const T r = sh[0];
  __syncthreads();
  return r;
}

// One block (1024 threads) per row.
__global__ void __launch_bounds__(1024) sample_kernel(const float* __restrict__ logits, int V,
                                                      const float* __restrict__ temp, const int32_t* __restrict__ topk,
                                                      const float* __restrict__ topp, const double* __restrict__ uni,
                                                      int32_t* __restrict__ out) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  __shared__ unsigned long long shu[32];
  __shared__ float hist_w[256];
  __shared__ int hist_c[256];
  __shared__ uint32_t chosen;
  __shared__ double seg_sum[1024];
  const int row = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  const float* x = logits + (size_t)row * V;
  const float T = temp[row];
  auto fmax_op = [](float a, float b) { return fmaxf(a, b); };
  if (!(T > 0.f)) {  // greedy: max value, then the smallest index holding it
    float m = -INFINITY;
    for (int i = tid; i < V; i += nt)
      if (!isnan(x[i])) m = fmaxf(m, x[i]);
    m = block_reduce(m, fmax_op, shf);
    unsigned long long best = ~0ull;
    for (int i = tid; i < V; i += nt)
      if (x[i] == m) best = min(best, (unsigned long long)i);
    best = block_reduce(best, [](unsigned long long a, unsigned long long b) { return a < b ? a : b; }, shu);
    if (tid == 0) out[row] = best == ~0ull ? 0 : (int32_t)best;
    return;
  }
  auto zval = [&](int i) { const float v = x[i]; return isnan(v) ? -INFINITY : v / T; };
  float zmax = -INFINITY;
  for (int i = tid; i < V; i += nt) zmax = fmaxf(zmax, zval(i));
  zmax = block_reduce(zmax, fmax_op, shf);
  // top-k: the k-th largest key by a 4-pass radix select (exact).
  uint32_t thr = 0;  // keep keys >= thr
  const int k = topk[row];
  if (k > 0 && k < V) {
    uint32_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += nt) hist_c[b] = 0;
      __syncthreads();
      for (int i = tid; i < V; i += nt) {
        const uint32_t key = order_key(zval(i));
        if ((key & mask) == prefix) atomicAdd(&hist_c[(key >> shift) & 255], 1);
      }
      __syncthreads();
      if (tid == 0) {
        int cum = 0, b = 255;
        for (; b > 0; --b) {
          if (cum + hist_c[b] >= remaining) break;
          cum += hist_c[b];
        }
        remaining -= cum;
        chosen = (uint32_t)b;
      }
      __syncthreads();
      prefix |= chosen << shift;
      mask |= 255u << shift;
      __syncthreads();
    }
    thr = prefix;
  }
  auto kept = [&](int i, float& w) {
    const float z = zval(i);
    if (z == -INFINITY || order_key(z) < thr) return false;
    w = expf(z - zmax);
    return true;
  };
  // top-p: the largest key tau with Σ_{key >= tau} w >= p · Σ w (weighted radix descent).
  const float p = topp[row];
  if (p < 1.f) {
    double W = 0;
    for (int i = tid; i < V; i += nt) {
      float w;
      if (kept(i, w)) W += w;
    }
    W = block_reduce(W, [](double a, double b) { return a + b; }, shd);
    const double target = (double)p * W;
    uint32_t prefix = 0, mask = 0;
    double above = 0;  // weight of keys above the current prefix range
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += nt) hist_w[b] = 0.f;
      __syncthreads();
      for (int i = tid; i < V; i += nt) {
        float w;
        if (!kept(i, w)) continue;
        const uint32_t key = order_key(zval(i));
        if ((key & mask) == prefix) atomicAdd(&hist_w[(key >> shift) & 255], w);
      }
      __syncthreads();
      if (tid == 0) {
        int b = 255, last_nonzero = -1;
        for (; b >= 0; --b) {
          if (hist_w[b] > 0.f) last_nonzero = b;
          if (above + hist_w[b] >= target) break;
          above += hist_w[b];
        }
        if (b < 0) b = last_nonzero < 0 ? 0 : last_nonzero;  // rounding: the lowest non-empty bin
        chosen = (uint32_t)b;
      }
      __syncthreads();
      prefix |= chosen << shift;
      mask |= 255u << shift;
      __syncthreads();
    }
    thr = max(thr, prefix);
  }
  // Inverse CDF in index order: contiguous segments per thread, a block scan.
  const int seg = (V + nt - 1) / nt, lo = min(V, tid * seg), hi = min(V, lo + seg);
  double s = 0;
  int last = -1;
  for (int i = lo; i < hi; ++i) {
    float w;
    if (kept(i, w)) s += w, last = i;
  }
  seg_sum[tid] = s;
  const int last_all = block_reduce(last, [](int a, int b) { return a > b ? a : b; }, reinterpret_cast<int*>(shf));
  __syncthreads();
  if (tid == 0) {
    double c = 0;
    for (int t = 0; t < nt; ++t) {
      const double v = seg_sum[t];
      seg_sum[t] = c;
      c += v;
    }
    shd[0] = c;
  }
  __syncthreads();
  const double total = shd[0], target = uni[row] * total, before = seg_sum[tid];
  if (tid == 0) chosen = 0xffffffffu;
  __syncthreads();
  if (s > 0 && before <= target && target < before + s) {
    double c = before;
    for (int i = lo; i < hi; ++i) {
      float w;
      if (!kept(i, w)) continue;
      c += w;
      if (c > target) {
        atomicMin(&chosen, (uint32_t)i);
        break;
      }
    }
  }
  __syncthreads();
  if (tid == 0) out[row] = chosen != 0xffffffffu ? (int32_t)chosen : (last_all >= 0 ? last_all : 0);
}

// packed_dequantize's fp32 variant (DequantVariant::fp32; the tensor_cores
// variant below is the default). Grid (⌈n_tokens/32⌉, Hkv, 2 sides), 128
// threads: 32 tokens per block so that each rotation is read once per 32
// tokens (chunked prefill dequantizes every earlier chunk again for each chunk). Per group: y_t,j = n_t ·
// c[idx_t,j] for the block's tokens, then x̂_t[ch_i] = Σ_j Π[j][i] y_t,j
// (fmaf over j ascending: the same arithmetic, hence bits, as one token per
// block). y is staged coordinate-major (y[j][t], 32 tokens contiguous) so
// that the product loop reads 4 tokens per shared-memory load (a broadcast:
// every thread of the warp reads the same y[j][t..t+3]): 8 loads per 32 FMAs
// instead of one per FMA, which bounded the loop by the load/store pipe;
// staging writes go token-fastest (conflict-free).
constexpr int kDequantTokens = 32;
__global__ void __launch_bounds__(128) dequant_kernel(const detail::HeadTables* __restrict__ tables,
                                                      const float* __restrict__ rot, const int32_t* __restrict__ chans,
                                                      const float* __restrict__ levels, const uint8_t* __restrict__ pool,
                                                      size_t page_bytes, const int32_t* __restrict__ page_table,
                                                      int hd, int n_tokens, uint16_t* __restrict__ k16,
                                                      uint16_t* __restrict__ v16) {
  __shared__ __align__(16) float y[256 * kDequantTokens];
  const int t0 = blockIdx.x * kDequantTokens, h = blockIdx.y, s = blockIdx.z, Hkv = gridDim.y;
  const int nt = min(kDequantTokens, n_tokens - t0);
  const detail::HeadTables& T = tables[h];
  uint16_t* o = (s == 0 ? k16 : v16);
  // Channels in no group are 0 (written first; the groups overwrite theirs after the barrier).
  for (int idx = threadIdx.x; idx < nt * hd; idx += blockDim.x)
    o[((size_t)(t0 + idx / hd) * Hkv + h) * hd + idx % hd] = 0;
  for (int g = 0; g < T.n_groups[s]; ++g) {
    const int dim = T.dim[s][g], bits = T.bits[s][g];
    const float* lv = levels + T.lvl_offset[s][g];
    __syncthreads();  // y free; the zeros written
    for (int idx = threadIdx.x; idx < kDequantTokens * dim; idx += blockDim.x) {
      const int t = idx % kDequantTokens, j = idx / kDequantTokens;
      float val = 0.f;
      if (t < nt) {
        const int tok = t0 + t, slot = tok % packed::kPageTokens;
        const uint8_t* head = pool + (size_t)page_table[tok / packed::kPageTokens] * page_bytes + T.block_offset;
        const float norm = __half2float(*reinterpret_cast<const __half*>(head + T.norm_offset[s][g] + 2 * slot));
        val = norm * lv[detail::read_code(head + T.code_offset[s][g], bits, s, slot, j)];
      }
      y[j * kDequantTokens + t] = val;
    }
    __syncthreads();
    const float* R = rot + T.rot_offset[s][g];
    const int32_t* ch = chans + T.chan_offset[s][g];
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      float acc[kDequantTokens];
#pragma unroll
      for (int t = 0; t < kDequantTokens; ++t) acc[t] = 0.f;
      for (int j = 0; j < dim; ++j) {
        const float r = R[(size_t)j * dim + i];
        const float4* yj = reinterpret_cast<const float4*>(y + j * kDequantTokens);
#pragma unroll
        for (int t4 = 0; t4 < kDequantTokens / 4; ++t4) {
          const float4 q = yj[t4];
          acc[4 * t4 + 0] = fmaf(r, q.x, acc[4 * t4 + 0]);
          acc[4 * t4 + 1] = fmaf(r, q.y, acc[4 * t4 + 1]);
          acc[4 * t4 + 2] = fmaf(r, q.z, acc[4 * t4 + 2]);
          acc[4 * t4 + 3] = fmaf(r, q.w, acc[4 * t4 + 3]);
        }
      }
      for (int t = 0; t < nt; ++t) o[((size_t)(t0 + t) * Hkv + h) * hd + ch[i]] = f16_bits(acc[t]);
    }
  }
}

// ---- packed_dequantize, tensor_cores variant ----------------------------------
// Grid (blocks_x, Hkv, 2 sides), kDqThreads threads; block (x, h, s) takes
// pages x, x + gridDim.x, … of the sequence (64 tokens each: one page is the
// block's token tile, so the page table may be in any order). Once per block
// it stages every group of side s of KV head h: Π_g (dim_pad × dim_pad,
// fp32 → fp16 round-to-nearest, zero-padded rows and columns ≥ dim, row
// stride dim_pad + 8 halves), the 2^b levels (fp16) and the channel list.
// Per page, per group: the levels L[t][j] = c[idx_t,j] (fp16, 64 × dim_pad,
// one thread per (16-channel tile, lane) decoding the 4·8 codes of its
// lane-words) and the norms n_t (fp32); then X = L · Π_g by WMMA 16×16×16
// (fp16 in, fp32 accumulate; warp w takes row tile w mod 4 and every second
// column tile from w / 4), and in the epilogue x̂_t[ch_i] = fp16(n_t · X[t][i])
// into a (64 × head_dim) fp16 staging tile (channels in no group stay 0),
// written to k16 / v16 row by row (16-byte stores when both are 16-byte
// aligned). Padded coordinates j ≥ dim multiply zero rows of the staged Π
// (the levels are finite), so their codes never matter; rows t ≥ n_tokens
// of the last page get n_t = 0 and are not written.
// Shared memory (dynamic; dequant_smem_bytes): the group records (DqGroup)
// | scratch (kDqWarps × 256 fp32, the epilogue's accumulator tiles) | norms
// (64 fp32) | levels (8 × 16 fp16) | channels (head_dim int32) | Π
// (r_halves fp16) | L (64 × ld_l fp16) | output tile (64 × (head_dim + 8)
// fp16). Every region starts 32-byte aligned (WMMA operands); head_dim 256
// with one group per side: 212.7 KB, one block per SM; head_dim 128: 2.
constexpr int kDqWarps = 8, kDqThreads = 32 * kDqWarps, kDqTokens = packed::kPageTokens, kDqPad = 8;
static_assert(kDqTokens == 64 && kDqWarps == 8, "warp w takes row tile w % 4 of the 64-token page");

struct DqGroup {
  int dim, dim_pad, bits, code_offset, norm_offset, chan_offset, rot_offset;
};
constexpr int kDqGroupBytes = 256;  // the group records, first in shared memory (32-byte multiple)
static_assert(sizeof(DqGroup) * packed::kMaxGroupsPerSide <= kDqGroupBytes, "group records fit");

// Decodes the codes of one (16-channel tile ct, lane) of a B-bit group over
// the page's 4 token tiles into L (row = token, column = rotated coordinate).
template <int B>
__device__ __forceinline__ void dq_decode_lane(const uint8_t* __restrict__ seg, int ct, int lane, int side,
                                               const __half* __restrict__ lvs, __half* __restrict__ L, int ld_l) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < B; ++i)
    w[i] = *reinterpret_cast<const uint32_t*>(seg + ((size_t)(ct * B + i) * packed::kWarpLanes + lane) * 4);
  // Inverse of packed::element_pos: element e of `lane` is (a, b) with
  // a = 8·(e/4) + lane/4, b = 8·((e/2) mod 2) + 2·(lane mod 4) + e mod 2,
  // (token, channel) = (a, b) for keys, (b, a) for values.
  const int la = lane >> 2, lb = 2 * (lane & 3);
#pragma unroll
  for (int tt = 0; tt < packed::kTilesPerPage; ++tt) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      uint32_t code;
      if constexpr (B == 3) {
        if (tt < 3) {
          code = (w[tt] >> (4 * e)) & 7u;
        } else {
          code = ((w[0] >> (4 * e + 3)) & 1u) | (((w[1] >> (4 * e + 3)) & 1u) << 1) |
                 (((w[2] >> (4 * e + 3)) & 1u) << 2);
        }
      } else {
        constexpr uint32_t mask = (1u << B) - 1u;
        const int q = tt * B;
        code = (w[q >> 2] >> (4 * e + (q & 3))) & mask;
      }
      const int a = 8 * (e >> 2) + la, b = 8 * ((e >> 1) & 1) + lb + (e & 1);
      const int tok = side == 0 ? a : b, chn = side == 0 ? b : a;
      L[(tt * packed::kTileTokens + tok) * ld_l + ct * packed::kTileChannels + chn] = lvs[code];
    }
  }
}

__global__ void __launch_bounds__(kDqThreads) dequant_tc_kernel(
    const detail::HeadTables* __restrict__ tables, const float* __restrict__ rot, const int32_t* __restrict__ chans,
    const float* __restrict__ levels, const uint8_t* __restrict__ pool, size_t page_bytes,
    const int32_t* __restrict__ page_table, int hd, int n_tokens, int r_halves, int ld_l, int vec_store,
    uint16_t* __restrict__ k16, uint16_t* __restrict__ v16) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char dq_smem[];
  DqGroup* grp = reinterpret_cast<DqGroup*>(dq_smem);
  float* scratch = reinterpret_cast<float*>(dq_smem + kDqGroupBytes);
  float* nrm = scratch + kDqWarps * 256;
  __half* lvs = reinterpret_cast<__half*>(nrm + kDqTokens);
  int32_t* chs = reinterpret_cast<int32_t*>(lvs + packed::kMaxGroupsPerSide * 16);
  __half* Rs = reinterpret_cast<__half*>(chs + hd);
  __half* Ls = Rs + r_halves;
  __half* Os = Ls + kDqTokens * ld_l;

  const int h = blockIdx.y, s = blockIdx.z, Hkv = gridDim.y, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, ld_o = hd + kDqPad;
  const detail::HeadTables& T = tables[h];
  const int ng = T.n_groups[s];
  if (tid < ng) {
    DqGroup G;
    G.dim = T.dim[s][tid];
    G.dim_pad = T.dim_pad[s][tid];
    G.bits = T.bits[s][tid];
    G.code_offset = T.code_offset[s][tid];
    G.norm_offset = T.norm_offset[s][tid];
    G.chan_offset = 0;
    G.rot_offset = 0;
    for (int g = 0; g < tid; ++g) {  // offsets into chs / Rs
      G.chan_offset += T.dim[s][g];
      G.rot_offset += T.dim_pad[s][g] * (T.dim_pad[s][g] + kDqPad);
    }
    grp[tid] = G;
  }
  __syncthreads();
  // Stage Π (fp16, padded with zeros), the levels and the channel lists.
  for (int g = 0; g < ng; ++g) {
    const DqGroup G = grp[g];
    const float* R = rot + T.rot_offset[s][g];
    __half* Rg = Rs + G.rot_offset;
    const int ldr = G.dim_pad + kDqPad;
    for (int idx = tid; idx < G.dim_pad * G.dim_pad; idx += kDqThreads) {
      const int j = idx / G.dim_pad, i = idx - j * G.dim_pad;
      Rg[j * ldr + i] = __float2half_rn(j < G.dim && i < G.dim ? R[(size_t)j * G.dim + i] : 0.f);
    }
    for (int i = tid; i < G.dim; i += kDqThreads) chs[G.chan_offset + i] = chans[T.chan_offset[s][g] + i];
    if (tid < 16) lvs[g * 16 + tid] = __float2half_rn(tid < (1 << G.bits) ? levels[T.lvl_offset[s][g] + tid] : 0.f);
  }
  uint16_t* out = s == 0 ? k16 : v16;
  const int n_pages = (n_tokens + kDqTokens - 1) / kDqTokens, hd8 = hd / 8;
  for (int p = blockIdx.x; p < n_pages; p += gridDim.x) {
    const int t0 = p * kDqTokens, nt = min(kDqTokens, n_tokens - t0);
    const uint8_t* head = pool + (size_t)page_table[p] * page_bytes + T.block_offset;
    __syncthreads();  // the previous page's output tile is written out (and, first page, the staging done)
    for (int idx = tid; idx < kDqTokens * hd8; idx += kDqThreads) {
      const int r = idx / hd8, c8 = idx - r * hd8;
      *reinterpret_cast<uint4*>(Os + r * ld_o + 8 * c8) = make_uint4(0u, 0u, 0u, 0u);
    }
    for (int g = 0; g < ng; ++g) {
      const DqGroup G = grp[g];
      __syncthreads();  // L and the norms free (the previous group's products done); the zeros written
      const int n_ct = G.dim_pad / packed::kTileChannels;
      const uint8_t* seg = head + G.code_offset;
      const __half* lv = lvs + g * 16;
      for (int item = tid; item < n_ct * 32; item += kDqThreads) {
        const int ct = item >> 5, ln = item & 31;
        switch (G.bits) {
          case 1: dq_decode_lane<1>(seg, ct, ln, s, lv, Ls, ld_l); break;
          case 2: dq_decode_lane<2>(seg, ct, ln, s, lv, Ls, ld_l); break;
          case 3: dq_decode_lane<3>(seg, ct, ln, s, lv, Ls, ld_l); break;
          default: dq_decode_lane<4>(seg, ct, ln, s, lv, Ls, ld_l); break;
        }
      }
      if (tid < kDqTokens)
        nrm[tid] = tid < nt ? __half2float(*reinterpret_cast<const __half*>(head + G.norm_offset + 2 * tid)) : 0.f;
      __syncthreads();
      const int n_nt = G.dim_pad / 16, ldr = G.dim_pad + kDqPad, m = warp & 3;
      const __half* Rg = Rs + G.rot_offset;
      const int32_t* ch = chs + G.chan_offset;
      float* sc = scratch + warp * 256;
      for (int n0 = warp >> 2; n0 < n_nt; n0 += 8) {  // up to 4 column tiles n0, n0 + 2, n0 + 4, n0 + 6
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) wmma::fill_fragment(acc[q], 0.f);
        for (int k = 0; k < n_nt; ++k) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
          wmma::load_matrix_sync(a, Ls + m * 16 * ld_l + k * 16, ld_l);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (n0 + 2 * q < n_nt) {
              wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
              wmma::load_matrix_sync(b, Rg + k * 16 * ldr + (n0 + 2 * q) * 16, ldr);
              wmma::mma_sync(acc[q], a, b, acc[q]);
            }
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int n = n0 + 2 * q;
          if (n < n_nt) {
            wmma::store_matrix_sync(sc, acc[q], 16, wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int e = lane; e < 256; e += 32) {
              const int r = e >> 4, i = n * 16 + (e & 15), row = m * 16 + r;
              if (i < G.dim) Os[row * ld_o + ch[i]] = __float2half_rn(sc[e] * nrm[row]);
            }
            __syncwarp();
          }
        }
      }
    }
    __syncthreads();  // the output tile complete
    if (vec_store) {
      for (int idx = tid; idx < nt * hd8; idx += kDqThreads) {
        const int r = idx / hd8, c8 = idx - r * hd8;
        *reinterpret_cast<uint4*>(out + ((size_t)(t0 + r) * Hkv + h) * hd + 8 * c8) =
            *reinterpret_cast<const uint4*>(Os + r * ld_o + 8 * c8);
      }
    } else {
      for (int idx = tid; idx < nt * hd; idx += kDqThreads) {
        const int r = idx / hd, c = idx - r * hd;
        out[((size_t)(t0 + r) * Hkv + h) * hd + c] = __half_as_ushort(Os[r * ld_o + c]);
      }
    }
  }
}

__global__ void __launch_bounds__(512) read_probe_kernel(const uint4* __restrict__ buf, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {  // four independent 16-byte loads in flight
    const uint4 a = buf[i], b = buf[i + stride], c = buf[i + 2 * stride], d = buf[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = buf[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  __shared__ uint32_t red[16];
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) a ^= red[w];
    sink[blockIdx.x] = a;
  }
}

__global__ void step_lengths_kernel(const int32_t* pos, int32_t* lens, int B) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < B) lens[b] = pos[b] + 1;
}
__global__ void step_advance_kernel(int32_t* pos, const int32_t* next, int32_t* hist, int32_t* count, int cap, int B) {
  const int c = *count;
  for (int b = threadIdx.x; b < B; b += blockDim.x) {
    pos[b] += 1;
    if (hist && c < cap) hist[(size_t)c * B + b] = next[b];
  }
  __syncthreads();
  if (threadIdx.x == 0) *count = c + 1;
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) detail::throw_error(detail::cat("CUDA: ", what, " launch failed: ", cudaGetErrorString(e)));
}

}  // namespace

void synthetic_fill_bf16(uint16_t* out, int64_t n, uint64_t seed, uint32_t tensor, int kind, int amp_exp,
                         uint64_t index0, void* stream) {
  require(out && n >= 0 && (kind == 0 || kind == 1), "synthetic_fill_bf16: bad arguments");
  if (n == 0) return;
  synth_bf16_kernel<<<blocks_for(n, 256, 8192), 256, 0, (cudaStream_t)stream>>>(out, n, seed, tensor, kind, amp_exp,
                                                                                index0);
  check_launch("synthetic_fill_bf16");
}
void synthetic_fill_f32(float* out, int64_t n, uint64_t seed, uint32_t tensor, int kind, int amp_exp, uint64_t index0,
                        void* stream) {
  require(out && n >= 0 && (kind == 0 || kind == 1), "synthetic_fill_f32: bad arguments");
  if (n == 0) return;
  synth_f32_kernel<<<blocks_for(n, 256, 8192), 256, 0, (cudaStream_t)stream>>>(out, n, seed, tensor, kind, amp_exp,
                                                                               index0);
  check_launch("synthetic_fill_f32");
}
void f32_to_bf16(const float* in, uint16_t* out, int64_t n, void* stream) {
  require(in && out && n >= 0, "f32_to_bf16: bad arguments");
  if (n == 0) return;
  f32_to_bf16_kernel<<<blocks_for(n, 256, 8192), 256, 0, (cudaStream_t)stream>>>(in, out, n);
  check_launch("f32_to_bf16");
}
void embed_rows(const uint16_t* table, const int32_t* tokens, int n, int d, float* x, void* stream, float scale) {
  require(table && tokens && x && n > 0 && d > 0 && scale > 0.f, "embed_rows: bad arguments");
  embed_kernel<<<n, 256, 0, (cudaStream_t)stream>>>(table, tokens, d, scale, x);
  check_launch("embed_rows");
}
void add_rms_norm(float* x, const float* delta, const float* w, int n, int d, float eps, uint16_t* out,
                  void* stream) {
  require(x && w && out && n > 0 && d > 0, "add_rms_norm: bad arguments");
  add_rms_norm_kernel<<<n, 256, 0, (cudaStream_t)stream>>>(x, delta, w, d, eps, out);
  check_launch("add_rms_norm");
}
void qkv_bias_rope(const float* qkv, const float* bias, const int32_t* pos, int n, int n_heads, int n_kv_heads,
                   int head_dim, bool neox, const double* inv_freq, const QkvRopeOut& out, void* stream,
                   const QkNorm& qk_norm) {
  require(qkv && pos && inv_freq && n > 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
          "qkv_bias_rope: bad arguments");
  require((qk_norm.q == nullptr) == (qk_norm.k == nullptr) && (!qk_norm.q || qk_norm.eps > 0.f),
          "qkv_bias_rope: QK-norm needs both weights and eps > 0");
  const size_t smem = qk_norm.q ? sizeof(float) * (size_t)(n_heads + n_kv_heads) : 0;
  require(smem <= 48 * 1024, "qkv_bias_rope: QK-norm of ", n_heads + n_kv_heads, " heads exceeds shared memory");
  qkv_rope_kernel<<<n, 256, smem, (cudaStream_t)stream>>>(qkv, bias, pos, n_heads, n_kv_heads, head_dim, neox,
                                                          inv_freq, qk_norm.q, qk_norm.k, qk_norm.eps, out);
  check_launch("qkv_bias_rope");
}
void swiglu(const float* gu, int n, int dff, uint16_t* out, void* stream) {
  require(gu && out && n > 0 && dff > 0, "swiglu: bad arguments");
  swiglu_kernel<<<blocks_for((int64_t)n * dff, 256, 8192), 256, 0, (cudaStream_t)stream>>>(gu, n, dff, out);
  check_launch("swiglu");
}
void geglu(const float* gu, int n, int dff, uint16_t* out, void* stream) {
  require(gu && out && n > 0 && dff > 0, "geglu: bad arguments");
  geglu_kernel<<<blocks_for((int64_t)n * dff, 256, 8192), 256, 0, (cudaStream_t)stream>>>(gu, n, dff, out);
  check_launch("geglu");
}
void rms_norm_f32(const float* x, const float* w, int n, int d, float eps, float* out, void* stream) {
  require(x && w && out && n > 0 && d > 0, "rms_norm_f32: bad arguments");
  rms_norm_f32_kernel<<<n, 256, 0, (cudaStream_t)stream>>>(x, w, d, eps, out);
  check_launch("rms_norm_f32");
}
void softcap(float* x, int64_t n, float cap, void* stream) {
  require(x && n >= 0 && cap > 0.f, "softcap: bad arguments (cap ", cap, " must be > 0)");
  if (n == 0) return;
  softcap_kernel<<<blocks_for(n, 256, 8192), 256, 0, (cudaStream_t)stream>>>(x, n, cap);
  check_launch("softcap");
}
void argmax_rows(const float* logits, int n, int V, int32_t* out, void* stream) {
  require(logits && out && n > 0 && V > 0, "argmax_rows: bad arguments");
  argmax_kernel<<<n, 1024, 0, (cudaStream_t)stream>>>(logits, V, out);
  check_launch("argmax_rows");
}
void causal_softmax(const float* S, int batch, int64_t stride, int rows, int cols, int r0, float scale, uint16_t* P,
                    void* stream, int window) {
  require(S && P && batch > 0 && rows > 0 && cols > 0 && r0 >= 0 && r0 + rows <= cols &&
              stride >= (int64_t)rows * cols && window >= 0,
          "causal_softmax: bad arguments");
  causal_softmax_kernel<<<batch * rows, 256, 0, (cudaStream_t)stream>>>(S, stride, rows, cols, r0, window, scale, P);
  check_launch("causal_softmax");
}
void fp16_write_tokens(uint16_t* pool, int n_kv_heads, int head_dim, const int32_t* page_table, int max_pages,
                       const int32_t* start, const float* k, const float* v, int n_tokens, int batch, void* stream) {
  require(pool && page_table && start && k && v && n_tokens > 0 && batch > 0 && max_pages > 0,
          "fp16_write_tokens: bad arguments");
  fp16_write_kernel<<<dim3(n_tokens, batch), 256, 0, (cudaStream_t)stream>>>(pool, n_kv_heads, head_dim, page_table,
                                                                            max_pages, start, k, v, n_tokens);
  check_launch("fp16_write_tokens");
}
void fp16_read_tokens(const uint16_t* pool, int n_kv_heads, int head_dim, const int32_t* page_table, int n_tokens,
                      uint16_t* k16, uint16_t* v16, void* stream) {
  require(pool && page_table && k16 && v16 && n_tokens > 0 && n_kv_heads > 0 && head_dim > 0,
          "fp16_read_tokens: bad arguments");
  fp16_read_kernel<<<n_tokens, 256, 0, (cudaStream_t)stream>>>(pool, n_kv_heads, head_dim, page_table, k16, v16);
  check_launch("fp16_read_tokens");
}
void prefill_tile_softmax(const float* S, int n_heads, int64_t stride, int rows, int cols, int q0, int t0,
                          float scale, float* m, float* l, float* o, int64_t o_ld, int head_dim, bool first,
                          uint16_t* P, void* stream, int window) {
  require(S && m && l && o && P && n_heads > 0 && rows > 0 && cols > 0 && q0 >= 0 && t0 >= 0 && head_dim > 0 &&
              stride >= (int64_t)rows * cols && o_ld >= (int64_t)n_heads * head_dim && window >= 0,
          "prefill_tile_softmax: bad arguments");
  tile_softmax_kernel<<<n_heads * rows, 256, 0, (cudaStream_t)stream>>>(S, stride, rows, cols, q0, t0, window, scale,
                                                                       m, l, o, o_ld, head_dim, first ? 1 : 0, P);
  check_launch("prefill_tile_softmax");
}
void normalize_rows(float* o, int64_t o_ld, int rows, int n_heads, int head_dim, const float* l, void* stream) {
  require(o && l && rows > 0 && n_heads > 0 && head_dim > 0 && o_ld >= (int64_t)n_heads * head_dim,
          "normalize_rows: bad arguments");
  normalize_rows_kernel<<<rows, 256, 0, (cudaStream_t)stream>>>(o, o_ld, n_heads, head_dim, l);
  check_launch("normalize_rows");
}
void sample_rows(const float* logits, int n, int V, const float* temperature, const int32_t* top_k,
                 const float* top_p, const double* u, int32_t* out, void* stream) {
  require(logits && temperature && top_k && top_p && u && out && n > 0 && V > 0, "sample_rows: bad arguments");
  sample_kernel<<<n, 1024, 0, (cudaStream_t)stream>>>(logits, V, temperature, top_k, top_p, u, out);
  check_launch("sample_rows");
}
static size_t dequant_smem_bytes(const PackedPlan& plan, int* r_halves, int* ld_l) {
  int rh = 0, max_pad = 16;
  for (const detail::HeadTables& T : plan.device().host_heads)
    for (int s = 0; s < 2; ++s) {
      int r = 0;
      for (int g = 0; g < T.n_groups[s]; ++g) {
        r += T.dim_pad[s][g] * (T.dim_pad[s][g] + kDqPad);
        max_pad = std::max(max_pad, T.dim_pad[s][g]);
      }
      rh = std::max(rh, r);
    }
  *r_halves = rh;
  *ld_l = max_pad + kDqPad;
  const size_t hd = (size_t)plan.head_dim();
  return kDqGroupBytes + kDqWarps * 256 * 4 + kDqTokens * 4 + packed::kMaxGroupsPerSide * 16 * 2 + hd * 4 +
         (size_t)rh * 2 + (size_t)kDqTokens * (max_pad + kDqPad) * 2 + (size_t)kDqTokens * (hd + kDqPad) * 2;
}
void packed_dequantize(const PackedPlan& plan, const uint8_t* pool, const int32_t* page_table, int n_tokens,
                       uint16_t* k16, uint16_t* v16, void* stream, DequantVariant variant) {
  require(pool && page_table && k16 && v16 && n_tokens > 0, "packed_dequantize: bad arguments");
  require(!plan.device().has_wide, "packed_dequantize: the plan has 5..8-bit groups (extension pages)");
  const auto& D = plan.device();
  const int Hkv = plan.layout().n_kv_heads(), hd = plan.head_dim();
  if (variant == DequantVariant::fp32) {
    dequant_kernel<<<dim3((n_tokens + kDequantTokens - 1) / kDequantTokens, Hkv, 2), 128, 0, (cudaStream_t)stream>>>(
        D.heads, D.rotations, D.channels, D.levels, pool, plan.layout().page_bytes(), page_table, hd, n_tokens, k16,
        v16);
    check_launch("packed_dequantize (fp32)");
    return;
  }
  require(variant == DequantVariant::tensor_cores, "packed_dequantize: unknown variant ", (int)variant);
  int r_halves = 0, ld_l = 0;
  const size_t smem = dequant_smem_bytes(plan, &r_halves, &ld_l);
  int dev = 0, sms = 0, optin = 0, per_sm = 0;
  RATEKV_CUDA_CHECK(cudaGetDevice(&dev));
  RATEKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  RATEKV_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  require(smem <= (size_t)optin, "packed_dequantize: the tensor-core kernel needs ", smem,
          " bytes of shared memory for this plan (head_dim ", hd, "), the device allows ", optin, " per block");
  static int smem_cache[detail::kMaxDevices] = {};
  detail::set_smem_limit((const void*)dequant_tc_kernel, smem, smem_cache);
  RATEKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dequant_tc_kernel, kDqThreads, smem));
  // Two waves of blocks over the (KV head, side) pairs; a block takes every
  // gridDim.x-th page (its Π staged once for all of them).
  const int n_pages = (n_tokens + kDqTokens - 1) / kDqTokens;
  const int64_t want = 2 * (int64_t)sms * std::max(per_sm, 1);
  const int bx = (int)std::clamp<int64_t>((want + 2 * Hkv - 1) / (2 * Hkv), 1, n_pages);
  const int vec = (reinterpret_cast<uintptr_t>(k16) % 16 == 0 && reinterpret_cast<uintptr_t>(v16) % 16 == 0) ? 1 : 0;
  dequant_tc_kernel<<<dim3(bx, Hkv, 2), kDqThreads, smem, (cudaStream_t)stream>>>(
      D.heads, D.rotations, D.channels, D.levels, pool, plan.layout().page_bytes(), page_table, hd, n_tokens,
      r_halves, ld_l, vec, k16, v16);
  check_launch("packed_dequantize");
}
void read_probe(const void* buf, size_t bytes, uint32_t* sink, void* stream) {
  require(buf && sink && bytes % 16 == 0 && bytes > 0, "read_probe: bad arguments");
  read_probe_kernel<<<kReadProbeBlocks, 512, 0, (cudaStream_t)stream>>>(static_cast<const uint4*>(buf), bytes / 16, sink);
  check_launch("read_probe");
}
void step_lengths(const int32_t* pos, int32_t* lens, int B, void* stream) {
  step_lengths_kernel<<<(B + 127) / 128, 128, 0, (cudaStream_t)stream>>>(pos, lens, B);
  check_launch("step_lengths");
}
void step_advance(int32_t* pos, const int32_t* next, int32_t* hist, int32_t* count, int hist_cap, int B,
                  void* stream) {
  step_advance_kernel<<<1, 256, 0, (cudaStream_t)stream>>>(pos, next, hist, count, hist_cap, B);
  check_launch("step_advance");
}

}  // namespace ratekv::cuda
