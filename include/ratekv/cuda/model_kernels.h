// ratekv/cuda/model_kernels.h — the GPU engine's own kernels (sm_90): what
// cuBLAS has no kernel for in a Llama/Qwen2/Gemma 3 forward pass (docs/design.md
// §10): embedding gather (and scale), RMSNorm with the residual add, fp32
// RMSNorm (Gemma's post-norms), Q/K/V bias + QK-norm + RoPE (both layouts) +
// split, SwiGLU / GeGLU, logit soft-capping, causal (optionally
// sliding-window) softmax of prefill scores, greedy argmax,
// the fp16 cache's page writer, the packed pages' dequantizer (evaluation-mode
// prefill), the synthetic weight generator (model/synthetic.h) and a
// read-bandwidth probe.
//
// All pointers are DEVICE pointers; streams are cudaStream_t passed as void*;
// every launch is asynchronous. bf16 and fp16 tensors are passed as their
// 16-bit patterns (uint16_t). Argument errors throw ratekv::Error before any
// launch; a failed launch throws Error naming the kernel. Row-major layouts,
// innermost dimension last; n = tokens (rows).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ratekv::cuda {

class PackedPlan;

/// out[i] = bf16 bits of synthetic_value(seed, tensor, index0 + i, kind,
/// amp_exp) (model/synthetic.h; kind 0 linear, 1 norm), i < n. Exact: the
/// values are bf16 numbers.
void synthetic_fill_bf16(uint16_t* out, int64_t n, uint64_t seed, uint32_t tensor, int kind,
                         int amp_exp, uint64_t index0, void* stream);
/// The same values as fp32.
void synthetic_fill_f32(float* out, int64_t n, uint64_t seed, uint32_t tensor, int kind, int amp_exp,
                        uint64_t index0, void* stream);

/// out = bf16(in) (round to nearest even), n elements.
void f32_to_bf16(const float* in, uint16_t* out, int64_t n, void* stream);

/// x (n, d) fp32 = table[tokens[i]] · scale (table: (vocab, d) bf16; the
/// product in fp32, as the CPU runtime's embd_scale: Gemma 3's √d_model).
/// Token ids are the caller's to check (the engine checks them on the host).
/// Throws Error for scale ≤ 0.
void embed_rows(const uint16_t* table, const int32_t* tokens, int n, int d, float* x, void* stream,
                float scale = 1.0f);

/// RMSNorm with the residual add (docs/design.md §1; ratekv::rms_norm): for
/// each row i < n, first x[i] += delta[i] when delta is non-null (x is
/// updated), then out[i] = bf16(x[i] · r · w) with r = fp32(1/√(Σx²/d + eps))
/// and Σx² in double, as the CPU runtime. x, delta: (n, d) fp32; w: (d) fp32;
/// out: (n, d) bf16.
void add_rms_norm(float* x, const float* delta, const float* w, int n, int d, float eps, uint16_t* out,
                  void* stream);

/// RMSNorm in fp32 (Gemma 3's post-norms on the attention and FFN outputs,
/// ratekv::rms_norm): out[i] = x[i] · r · w, r = fp32(1/√(Σx²/d + eps)), Σx²
/// in double. x, out: (n, d) fp32 (out may be x); w: (d) fp32.
void rms_norm_f32(const float* x, const float* w, int n, int d, float eps, float* out, void* stream);

/// Gemma 3's QK-norm (ModelConfig::qk_norm): RMSNorm over each head of Q
/// (weights q, (head_dim) fp32, shared by the heads) and of K (weights k),
/// after the bias and before RoPE, as the CPU runtime (x · r · w, Σx² in
/// double). Both null: none.
struct QkNorm {
  const float* q = nullptr;
  const float* k = nullptr;
  float eps = 0.f;
};

/// Q/K/V split, bias, QK-norm (optional) and RoPE of n tokens (model.h's RoPE: block i rotated by
/// pos·f_i, f_i = inv_freq[i] = θ^(−2i/hd) in double, cos/sin rounded to fp32;
/// channel pairs (2i, 2i+1) (neox = false, GGUF "llama") or (i, i + hd/2)
/// (neox = true, "qwen2")).
///   qkv  : (n, (H + 2·Hkv)·hd) fp32, Q rows then K then V (the QKV GEMM);
///   bias : ((H + 2·Hkv)·hd) fp32 added first, or null;
///   pos  : (n) int32 positions;
/// outputs (each may be null): q32 (n, H, hd) fp32, q16 (n, H, hd) fp16,
/// k32 / v32 (n, Hkv, hd) fp32, k16 / v16 (n, Hkv, hd) fp16; k_pre32 (n,
/// Hkv, hd) fp32 the keys after the bias (and QK-norm), before RoPE (what vq keys encode,
/// cuda::vq_append).
struct QkvRopeOut {
  float* q32 = nullptr;
  uint16_t* q16 = nullptr;
  float* k32 = nullptr;
  float* v32 = nullptr;
  uint16_t* k16 = nullptr;
  uint16_t* v16 = nullptr;
  float* k_pre32 = nullptr;  // last: positional initializers of the fields above stay valid
};
void qkv_bias_rope(const float* qkv, const float* bias, const int32_t* pos, int n, int n_heads,
                   int n_kv_heads, int head_dim, bool neox, const double* inv_freq, const QkvRopeOut& out,
                   void* stream, const QkNorm& qk_norm = {});

/// SwiGLU: out[i, j] = bf16(silu(gu[i, j]) · gu[i, dff + j]), silu(x) =
/// x/(1 + e^−x); gu: (n, 2·dff) fp32 (gate rows then up rows of the GEMM),
/// out: (n, dff) bf16.
void swiglu(const float* gu, int n, int dff, uint16_t* out, void* stream);
/// GeGLU (Gemma 3): out[i, j] = bf16(gelu(gu[i, j]) · gu[i, dff + j]) with
/// GELU's tanh approximation 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))
/// in fp32 (the CPU runtime's gelu_tanh); layouts as swiglu.
void geglu(const float* gu, int n, int dff, uint16_t* out, void* stream);

/// Final logit soft-capping (ModelConfig::final_logit_softcap): x[i] =
/// cap · tanh(x[i] / cap) in fp32, n elements. Throws Error for cap ≤ 0.
void softcap(float* x, int64_t n, float cap, void* stream);

/// Greedy sampling: out[i] = argmax_j logits[i, j] (the smallest j among
/// equal maxima; NaN entries never win), logits (n, V) fp32.
void argmax_rows(const float* logits, int n, int V, int32_t* out, void* stream);

/// Causal softmax of prefill scores for `batch` matrices S_b (rows, cols)
/// fp32 (matrix stride `stride` elements, row stride cols): row i of a query
/// chunk starting at absolute row r0 sees columns j ≤ r0 + i:
///   P_b[i, j] = fp16(exp(scale·S_b[i,j] − m_i) / Σ_j' exp(scale·S_b[i,j'] − m_i)),
/// 0 for j > r0 + i. P has the layout of S (fp16). window > 0: a sliding
/// window (model/sliding_window.h) — row i also sees only columns j >
/// r0 + i − window (column j at the same position scale as the rows: the
/// caller offsets both by the same first key); the sum runs over those only.
void causal_softmax(const float* S, int batch, int64_t stride, int rows, int cols, int r0, float scale,
                    uint16_t* P, void* stream, int window = 0);

/// Writes n_tokens tokens per sequence into an fp16 cache pool (the layout of
/// fp16_decode_attention: per (page, KV head) K (64, hd) then V (64, hd)):
/// token i of sequence b goes to position start[b] + i.
///   k, v       : (batch, n_tokens, Hkv, hd) fp32
///   page_table : (batch, max_pages) int32; start: (batch) int32
/// 64-bit page offsets (pools over 4 GiB).
void fp16_write_tokens(uint16_t* pool, int n_kv_heads, int head_dim, const int32_t* page_table, int max_pages,
                       const int32_t* start, const float* k, const float* v, int n_tokens, int batch,
                       void* stream);

/// How packed_dequantize computes the rotation product x̂ = n · Πᵀ c:
///  tensor_cores — (default) per page and group, the levels c[idx] (fp16)
///                 times Π (rounded to fp16 once per launch) on tensor cores
///                 (WMMA 16×16×16, fp32 accumulation), then × the fp32 norm,
///                 rounded to fp16 once. With u = 2⁻¹¹ (fp16 unit roundoff),
///                 each element is within u·|x̂_i| + 2.1·u·‖x̂_g‖ of the exact
///                 x̂ (‖x̂_g‖ = n‖c‖ the group's reconstructed norm: the two
///                 operand roundings contribute ≤ 2u·n·Σ_j|c_j Π_ji| ≤
///                 2u·‖x̂_g‖ by Cauchy–Schwarz, Π orthogonal; 0.1u covers
///                 the fp32 sums), i.e. ~1e-3 of the group's norm; the RMS
///                 error is ~u of the RMS value (tests/engine bound it by 2u).
///  fp32         — the levels, Π and norms in fp32 FMA (CUDA cores; the
///                 CPU decoder's value up to fp32 summation order, then one
///                 fp16 rounding). The default before issue 18 (1.08x the
///                 fp16 cache's chunked-prefill TTFT at 128K, Llama-3.1-8B);
///                 kept for comparisons (tests, bench_cuda_dequant).
enum class DequantVariant { tensor_cores, fp32 };

/// The reconstructions x̂ = n·Πᵀ c[idx] (per group, docs/packed_format.md) of
/// positions 0 .. n_tokens−1 of one sequence's packed pages (page_table: its
/// row, any order of physical pages), as fp16: k16, v16 (n_tokens, Hkv, hd)
/// row-major. What evaluation-mode and chunked prefill attend to. Channels
/// in no group are 0. Arithmetic and error bound: DequantVariant (the
/// default, tensor_cores, is not bit-equal to the CPU decoder). Throws Error
/// for a plan with 5..8-bit groups (packed_dequantize_wide serves them), for
/// null pointers or n_tokens ≤ 0, and when the tensor_cores kernel's shared
/// memory for the plan (Π of every group of a side staged as fp16: up to
/// ~200 KB at head_dim 256) exceeds the device's per-block limit.
void packed_dequantize(const PackedPlan& plan, const uint8_t* pool, const int32_t* page_table, int n_tokens,
                       uint16_t* k16, uint16_t* v16, void* stream,
                       DequantVariant variant = DequantVariant::tensor_cores);

/// The fp16 cache's reader (inverse of fp16_write_tokens for one sequence):
/// positions 0 .. n_tokens−1 of the pages in page_table (that sequence's row,
/// possibly offset by whole pages) → k16, v16 (n_tokens, Hkv, hd) fp16,
/// bit-exact copies. What chunked prefill attends to over an fp16 cache.
void fp16_read_tokens(const uint16_t* pool, int n_kv_heads, int head_dim, const int32_t* page_table, int n_tokens,
                      uint16_t* k16, uint16_t* v16, void* stream);

/// Chunked prefill's attention over key tiles (online softmax, docs/design.md
/// §6's SoftmaxState on the GPU). For each head h < n_heads and query row
/// i < rows of a tile's scores S_h (rows, cols) fp32 (head stride `stride`,
/// row stride cols), query at absolute position q0 + i, key column j at
/// absolute position t0 + j, visible when t0 + j ≤ q0 + i (and, window > 0,
/// t0 + j > q0 + i − window: a sliding window, model/sliding_window.h):
///   m' = max(m, max_j scale·S[i,j]),  α = exp(m − m') (0 when m = −∞),
///   P[i,j] = fp16(exp(scale·S[i,j] − m')) (0 where not visible),
///   l ← α·l + Σ_j P[i,j] (the fp16 values),  m ← m',
///   o[i, h·hd .. h·hd+hd) ← α·o (row stride o_ld floats),
/// so that a following O += P·V accumulates the unnormalized output. A row
/// with no visible key in the tile keeps m, l and o and gets P = 0.
/// m, l: (rows, n_heads) fp32. `first`: the first tile of the rows — m, l
/// and o are read as −∞, 0 and 0 (whatever they hold).
void prefill_tile_softmax(const float* S, int n_heads, int64_t stride, int rows, int cols, int q0, int t0,
                          float scale, float* m, float* l, float* o, int64_t o_ld, int head_dim, bool first,
                          uint16_t* P, void* stream, int window = 0);
/// o[i, h·hd + c] /= l[i, h] after the last tile (0 where l = 0); o (rows,
/// ≥ n_heads·hd, row stride o_ld) fp32, l (rows, n_heads).
void normalize_rows(float* o, int64_t o_ld, int rows, int n_heads, int head_dim, const float* l, void* stream);

/// Token sampling of n rows of logits (n, V) fp32 by the definition of
/// ratekv/engine/sampling.h (its host reference: engine::sample_reference):
/// per row temperature[i] (≤ 0: argmax, the smallest index among maxima),
/// top_k[i] (0: all; the k-th largest by an exact radix select, ties kept),
/// top_p[i] (1: all; τ by a weighted radix descent), u[i] uniform in
/// [0, 1); out[i] the token. NaN logits are never picked. fp32 exp, double
/// sums (in another order than the reference: a u within rounding of a
/// boundary between two tokens may pick the neighbour).
void sample_rows(const float* logits, int n, int V, const float* temperature, const int32_t* top_k,
                 const float* top_p, const double* u, int32_t* out, void* stream);

/// Read-bandwidth probe: reads `bytes` (a multiple of 16) of `buf` once with
/// 16-byte loads; sink (2048 words) gets per-block XORs of the 32-bit words
/// read, whose XOR is the XOR of the whole buffer (a check that every byte was
/// read). Time it with events: bytes / time is the read ceiling.
inline constexpr int kReadProbeBlocks = 2048;
void read_probe(const void* buf, size_t bytes, uint32_t* sink, void* stream);

/// Decode-step bookkeeping (B sequences): lens[b] = pos[b] + 1 (the lengths
/// attention sees after the step's append).
void step_lengths(const int32_t* pos, int32_t* lens, int B, void* stream);
/// End of a decode step: pos[b] += 1; hist[(*count)·B + b] = next[b] when
/// *count < hist_cap; then *count += 1.
void step_advance(int32_t* pos, const int32_t* next, int32_t* hist, int32_t* count, int hist_cap, int B,
                  void* stream);

}  // namespace ratekv::cuda
