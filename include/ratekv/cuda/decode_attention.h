// ratekv/cuda/decode_attention.h — CUDA (sm_90) decode attention over the
// packed KV cache (docs/packed_format.md) and over an fp16 cache of the same
// page structure, plus quantize-append of one decode token.
//
// Everything here takes DEVICE pointers and a cudaStream_t (as void*, so this
// header needs no CUDA include) and is asynchronous. Errors in arguments throw
// ratekv::Error before anything is launched; CUDA failures throw ratekv::Error
// naming the call. Unsupported (head_dim, bits, dtype, GQA) combinations throw,
// naming the combination; there is no fallback path.
//
// Shapes (row-major, innermost last):
//   q    : (batch, n_heads, head_dim)    fp32 or fp16, post-RoPE
//   k, v : (batch, n_kv_heads, head_dim) fp32 or fp16 (append input)
//   out  : (batch, n_heads, head_dim)    fp32
//   page_table : (batch, max_pages) int32 physical page ids; seq_lens : (batch) int32
// GQA: query head q reads KV head q / (n_heads / n_kv_heads).
//
// Every kernel family has a named CPU reference with the same inputs and the
// kernel's rounding, built and tested without CUDA (include/ratekv/ref/):
//   packed_decode_attention  ref::packed_decode_attention (PackedRounding)
//   fp16_decode_attention    ref::fp16_decode_attention
//   packed_append / _prefill ref::packed_append / ref::packed_prefill
//   vq_decode_attention      ref::vq_decode_attention
// tests/cuda and bench/cuda compare the kernels with them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ratekv/format/packed_format.h"

namespace ratekv::packed {
class VqLayerLayout;  // ratekv/format/packed_vq_format.h
}

namespace ratekv::cuda {

enum class DType { f32, f16 };

/// The sequences of one decode step, all device pointers.
struct DecodeBatch {
  const int32_t* page_table = nullptr;  ///< (batch, max_pages) physical page ids
  int max_pages = 0;                    ///< row stride of page_table
  const int32_t* seq_lens = nullptr;    ///< (batch) cached tokens; attention needs ≥ 1
  int batch = 0;
  int max_seq_len = 0;                  ///< host-known bound ≥ every seq_lens[b]
  /// Sliding-window attention (Gemma 3's local layers; model/sliding_window.h):
  /// 0 = every cached token; W > 0 = sequence b attends to positions
  /// max(0, seq_lens[b] − W) .. seq_lens[b] − 1 only (the decode query at
  /// position seq_lens[b] − 1 sees keys at positions > its own − W, as
  /// AttnParams::sliding_window). The split-K partition then covers
  /// window_span_tokens(max_seq_len, W, unit) tokens from the unit (page or
  /// 16-token tile) holding the first visible key; pages before it are not
  /// read, the keys before it in that unit are masked (they must be written:
  /// a sequence's pages are never freed while it lives). Implemented by
  /// fp16_decode_attention (both variants) and packed_decode_attention with
  /// GQA ≤ 8 and 1..4-bit groups; packed GQA > 8, 5..8-bit plans and
  /// vq_decode_attention throw naming `window`. packed_append and
  /// packed_prefill ignore it (they write at seq_lens).
  int window = 0;
};

/// A layer's packed layout uploaded for the kernels, with its rotations and
/// codebooks (TurboQuant-MSE, docs/design.md §2).
///   rotations: for h in heads, side in (key, value), group g: dim×dim fp32
///              row-major, y = Π u (so x̂ = n Πᵀ c[idx]); concatenated.
///   levels:    same order, 2^bits fp32 Lloyd–Max levels, strictly ascending.
/// A side of a KV head may have no groups (all its channels at 0 bits,
/// docs/packed_format.md §6): its scores are 0 / its output channels 0, as in
/// the CPU packed cache.
/// Throws Error when a span has the wrong length, levels are not ascending,
/// n_heads is not a multiple of n_kv_heads, GQA > 16, head_dim ∉ {64,128,256},
/// or the padded groups of a side need more tiles than the kernels hold
/// (head_dim/16 + 2 for head_dim ≤ 128, 16 for 256).
/// Which dense rotation matrices a PackedPlan uploads for packed_prefill's
/// tensor-core variant (PackedPlan::Device::prefill_m16 / prefill_m32, 2 ·
/// n_kv_heads · head_dim² values each): f16 for fp16 K/V inputs, f32 for fp32
/// inputs (the GPU engine's), both (the default: any input), none (plans that
/// only decode or use PrefillVariant::fp32).
enum class PrefillMatrices { both, f16, f32, none };

class PackedPlan {
 public:
  PackedPlan(const packed::LayerLayout& layout, int n_heads, std::span<const float> rotations,
             std::span<const float> levels, PrefillMatrices prefill = PrefillMatrices::both);
  /// A plan with groups of 5..8 bits (docs/packed_format.md §5, the CPU
  /// packed cache's PackedKVCache::ext_layout): `layout` holds every group
  /// (a b-bit group as its low 4-bit part), `ext` the high (b − 4)-bit parts
  /// of the wide groups, per KV head and side in the order of the wide groups
  /// of `layout` (matched by channel list). `levels` has 2^b levels for a
  /// wide group. Such plans run on the generic (non-tensor-core) decode
  /// kernel and need the extension pool (packed_decode_attention's ext_pool);
  /// packed_append / packed_prefill reject them. Throws Error when ext does
  /// not match layout (head_dim, heads, a wide part without a 4-bit main
  /// group of the same channels), besides the checks above.
  PackedPlan(const packed::LayerLayout& layout, const packed::LayerLayout& ext, int n_heads,
             std::span<const float> rotations, std::span<const float> levels);
  ~PackedPlan();
  PackedPlan(const PackedPlan&) = delete;
  PackedPlan& operator=(const PackedPlan&) = delete;

  const packed::LayerLayout& layout() const { return layout_; }
  /// The extension layout of a plan with 5..8-bit groups, else nullptr.
  const packed::LayerLayout* ext_layout() const { return ext_ ? &*ext_ : nullptr; }
  int n_heads() const { return n_heads_; }
  int head_dim() const { return layout_.head_dim(); }
  int gqa() const { return n_heads_ / layout_.n_kv_heads(); }

  struct Device;  ///< device-side tables (opaque)
  const Device& device() const { return *dev_; }
  /// Bytes of device memory this plan allocated (every table, as requested
  /// from cudaMalloc); equals packed_plan_device_bytes(layout(), prefill) for
  /// a plan without 5..8-bit groups.
  size_t device_bytes() const { return device_bytes_; }

 private:
  void build(std::span<const float> rotations, std::span<const float> levels);
  packed::LayerLayout layout_;
  std::optional<packed::LayerLayout> ext_;
  int n_heads_;
  PrefillMatrices prefill_ = PrefillMatrices::both;
  size_t device_bytes_ = 0;
  std::unique_ptr<Device> dev_;
};

/// Device bytes a PackedPlan(layout, n_heads, …, prefill) allocates, computed
/// from the layout alone (no GPU needed; the memory plan of the GPU engine,
/// ratekv/engine/engine.h, counts it before any allocation): per KV head one
/// head table and one wide table, every group's Π (dim² fp32), channel list
/// (dim int32) and 2^bits fp32 levels, and the prefill matrices `prefill`
/// asks for (2 · n_kv_heads · head_dim² · 2 or 4 bytes). Plans with an
/// extension layout (5..8-bit groups) are not covered.
size_t packed_plan_device_bytes(const packed::LayerLayout& layout, PrefillMatrices prefill);

/// Which kernel runs (plans of 1..4-bit groups; 5..8-bit ones always take the
/// generic kernel):
///  runtime_tables — bit widths, codebooks and offsets read per 16-channel tile
///                   from the head tables (any plan); fp16 levels and query,
///                   fp32 accumulation. GQA ≤ 8: the query rows are the MMA's
///                   N side (decode_attention_gqa8.cu); GQA 9..16: its M side
///                   (decode_attention_packed.cu);
///  specialized    — (default) plans of 1..4-bit groups with GQA ≤ 8: integer
///                   tensor-core products — uniform plans (one b-bit key and
///                   one b-bit value group over every head, b = 1..4) with
///                   compile-time widths and offsets; any other plan
///                   (Block-GTQ, RateQuant) with widths and int8 codebooks
///                   per group from the head tables, each key group's
///                   integer sums folded with its norms. Key and value levels
///                   as ref::int8_levels (one scale per codebook); the
///                   rotated fp16 query split into two int8 parts
///                   (q ≈ s·(hi + lo/254), s = max|q|/127 per row, error
///                   ≤ 1.6e-5·max|q|; other plans split key group g's
///                   channels of q·ρ_g, ρ_g = its int8 scale over the
///                   head's largest key scale, error ≤ 1.6e-5·max|q|/ρ_g);
///                   P ∘ n^V scaled per row, 64-token page
///                   and value group by 127/(max_t p_t · max_t|n^V_t|),
///                   rounded to fp16 and split the same way; int32
///                   accumulation. GQA > 8: as runtime_tables.
/// Both decode codes with byte permutes from codebooks in registers; both are
/// tested against their named CPU reference, ref::packed_decode_attention
/// (include/ratekv/ref/packed_decode_attention.h), with the levels each uses.
enum class PackedDecodeVariant { runtime_tables, specialized };

/// Whether packed_decode_attention(plan, …, variant) runs an integer kernel
/// (variant specialized, GQA ≤ 8, no 5..8-bit group) with int8 key and value
/// levels (ref::int8_levels, include/ratekv/ref/int8_levels.h) instead of fp16
/// ones: then its CPU reference is
/// ref::packed_decode_attention with PackedRounding::int8_levels.
bool uses_int8_levels(const PackedPlan& plan, PackedDecodeVariant variant);

/// The kernel packed_decode_attention(plan, …, variant) runs (the dispatch's
/// choice, for logs, benchmarks and tests): "generic (5..8-bit groups)",
/// "16-row fp16 (GQA > 8)", or at GQA ≤ 8 "GQA<=8 uniform int8, b bits",
/// "GQA<=8 general int8, one value group per head" (every head's value side
/// one group over head_dim channels: Block-GTQ, RateQuant), "GQA<=8 general
/// int8" (any other plan under specialized) or "GQA<=8 general fp16"
/// (runtime_tables). docs/design.md §8.
std::string packed_decode_kernel_name(const PackedPlan& plan, PackedDecodeVariant variant);

/// Workspace bytes for a decode step (split-K partial states + rotated query).
size_t decode_workspace_bytes(int batch, int n_heads, int head_dim, int n_splits);

/// Split count for the uniform instances' occupancy (16 warps per SM), ≥ 1.
int default_splits(int batch, int n_kv_heads, int max_seq_len);

/// Split count for the instance `plan` runs on (at most one wave of that
/// instance's warps; ≥ 2 pages per split,
/// one page per split for grids under 1024 warps: measured, docs/cuda_results.md;
/// GQA ≤ 8 with 1..4-bit groups: at least one CTA's warps — 8, 4 at head_dim
/// 256 — or one split per page when there are fewer pages, also past one wave:
/// large batches at short contexts, where the kernel then merges in the CTA);
/// what packed_decode_attention uses for n_splits = 0, so size its workspace
/// with decode_workspace_bytes(…, default_splits(plan, batch, max_seq_len)).
int default_splits(const PackedPlan& plan, int batch, int max_seq_len);
/// default_splits(plan, …) of a plan built from `layout` (no extension
/// layout) with n_heads query heads, without building it (no GPU tables; the
/// GPU engine's memory plan sizes the decode workspace with it).
int default_splits(const packed::LayerLayout& layout, int n_heads, int batch, int max_seq_len);

/// Fused split-K decode attention over the packed cache:
///   out[b,q] = Σ_g Π_gᵀ Σ_t softmax_t(scale · q·k̂_t) · n^V_{g,t} c_g[idx^V_{g,t}]
/// with the score q·k̂_t = Σ_g n^K_{g,t} (Π_g q_g)·c_g[idx^K_{g,t}] computed in
/// each key group's rotated domain. The rotated, scaled query is rounded to
/// fp16 and the levels to fp16 (tensor cores, fp32 accumulation; the integer
/// kernels' int8 levels and integer Q·Kᵀ and P·V: PackedDecodeVariant); P is
/// rounded to fp16 after multiplying by the value norm (integer kernels: after
/// scaling per row, page and value group, then split into two int8 parts). `pool` holds the layer's pages
/// (layout.page_bytes() each). n_splits = 0 picks default_splits(plan, …).
/// GQA ≤ 8: each CTA (8 splits; 4 at head_dim 256) merges its splits'
/// states; with n_splits ≤ 8 (≤ 4) one CTA holds all the splits of a
/// (sequence, KV head) and also rotates back itself (two launches instead of
/// three), else a merge launch combines one state per CTA. The same result up
/// to fp32 summation order (docs/design.md §8).
void packed_decode_attention(const PackedPlan& plan, const DecodeBatch& batch,
                             const uint8_t* pool, const void* q, DType q_dtype, float scale,
                             float* out, void* workspace, size_t workspace_bytes, int n_splits,
                             void* stream,
                             PackedDecodeVariant variant = PackedDecodeVariant::specialized);

/// The same for a plan with 5..8-bit groups: `ext_pool` holds the extension
/// pages (plan.ext_layout()->page_bytes() each, same page table: physical
/// page p of the pool ↔ physical page p of ext_pool). A plan without wide
/// groups ignores ext_pool (may be nullptr). Plans with wide groups run on
/// the generic kernel: one thread per token for the scores, codes read bit
/// by bit (correctness path, no bandwidth target); same rounding as the
/// tensor-core kernels (fp16 rotated query and levels, fp32 accumulation).
void packed_decode_attention(const PackedPlan& plan, const DecodeBatch& batch,
                             const uint8_t* pool, const uint8_t* ext_pool, const void* q,
                             DType q_dtype, float scale, float* out, void* workspace,
                             size_t workspace_bytes, int n_splits, void* stream);

/// RoPE of the keys of a vq plan (docs/design.md §5.5: keys are quantized pre-RoPE
/// and rotated at the key's position in attention), as ratekv::apply_rope:
/// block i = channels (2i, 2i+1) (interleaved, GGUF "llama") or (i, i + d/2)
/// (NeoX), angle pos · θ^(−2i/d) in double, cos/sin rounded to fp32.
struct VqRope {
  bool neox = false;
  double theta = 10000.0;  ///< the layer's RoPE base (> 0, finite)
};

/// A layer's vq pages (docs/packed_format.md §7; TaSQ / CQ plans, codec kind
/// vq, and fp16 sides) uploaded for vq_decode_attention.
///   codewords: for h in KV heads, side in (key, value) whose kind is vq:
///              (G, 2^bits, g) fp32 reconstruction codewords C̃ = C / a
///              (channel weights folded in, cache::VqCodec), concatenated;
///   channels:  same order, (G, g) int32: the head channel of coordinate i
///              of group gi (each channel of the head exactly once).
/// The key side must be in the vq pages (kind vq or fp16). The value side is
/// in the vq pages too, or — kind none here — a scalar TQ-MSE side in the
/// layer's scalar pages (docs/packed_format.md §2–3, the CPU packed cache's
/// layout(layer)): then `scalar_values` is its PackedPlan (no key groups in
/// any head; kept alive by the caller) and vq_decode_attention reads those
/// pages from `scalar_pool`, accumulating in each value group's rotated domain
/// (fp32 levels, fp16 norms) and rotating back in the merge.
/// Throws Error on wrong span lengths, a channel list that is not a
/// permutation, non-finite codewords, GQA > 16, head_dim > 256 or odd, a bad
/// RoPE base, or a value side in neither page kind / a scalar plan that does
/// not match (head_dim, heads, key groups).
class VqPlan {
 public:
  VqPlan(const packed::VqLayerLayout& layout, int n_heads, std::span<const float> codewords,
         std::span<const int32_t> channels, VqRope rope,
         const PackedPlan* scalar_values = nullptr);
  ~VqPlan();
  VqPlan(const VqPlan&) = delete;
  VqPlan& operator=(const VqPlan&) = delete;

  const packed::VqLayerLayout& layout() const { return *layout_; }
  /// The scalar TQ-MSE value side's plan, or nullptr.
  const PackedPlan* scalar_values() const { return scalar_; }
  int n_heads() const { return n_heads_; }
  int head_dim() const { return head_dim_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int gqa() const { return n_heads_ / n_kv_heads_; }

  struct Device;  ///< device-side tables (opaque)
  const Device& device() const { return *dev_; }
  /// Bytes of device memory this plan allocated; equals
  /// vq_plan_device_bytes(n_kv_heads(), head_dim(), codewords.size(), channels.size()).
  size_t device_bytes() const { return device_bytes_; }

 private:
  std::unique_ptr<packed::VqLayerLayout> layout_;  // (this header does not include packed_vq_format.h)
  const PackedPlan* scalar_ = nullptr;
  int n_heads_, head_dim_, n_kv_heads_;
  size_t device_bytes_ = 0;
  std::unique_ptr<Device> dev_;
};

/// Device bytes a VqPlan over n_kv_heads heads of head_dim with
/// `n_codewords` codeword floats and `n_channels` channel entries allocates
/// (no GPU needed; the GPU engine's memory plan): the codewords (fp32), the
/// channel lists (int32), the codeword/channel offsets (int64, 4 per KV head)
/// and the RoPE frequencies (fp64, head_dim / 2).
size_t vq_plan_device_bytes(int n_kv_heads, int head_dim, size_t n_codewords, size_t n_channels);

/// Split count vq_decode_attention uses for n_splits = 0 (size the workspace
/// with decode_workspace_bytes(…, default_splits(plan, batch, max_seq_len))).
int default_splits(const VqPlan& plan, int batch, int max_seq_len);
/// The same for a VqPlan over n_kv_heads KV heads, without building it.
int vq_default_splits(int n_kv_heads, int batch, int max_seq_len);

/// Split-K decode attention over vq pages (correctness path: no tensor
/// cores, no bandwidth target):
///   k̂_t = RoPE_t(s_t · C̃[z_t]) (vq keys; fp16 keys are stored post-RoPE),
///   v̂_t = s_t · C̃[z_t], the fp16 row, or (scalar values) Σ_g Π_gᵀ n_g c_g[idx],
///   out[b,q] = Σ_t softmax_t(scale · q·k̂_t) v̂_t
/// in fp32 (query not rounded), at positions t = 0 … seq_lens[b]−1. `pool`
/// holds the layer's vq pages (layout().page_bytes() each), `scalar_pool` its
/// scalar pages when the values are scalar (else ignored, may be nullptr),
/// both under the page table of `batch`. Shapes as packed_decode_attention
/// (q (batch, n_heads, head_dim) fp32/fp16, out fp32).
void vq_decode_attention(const VqPlan& plan, const DecodeBatch& batch, const uint8_t* pool,
                         const uint8_t* scalar_pool, const void* q, DType q_dtype, float scale,
                         float* out, void* workspace, size_t workspace_bytes, int n_splits,
                         void* stream);

/// Which fp16 decode kernel runs:
///  rows16    — the query rows of a KV head as the M side of mma.m16n8k16
///              (GQA ≤ 16; decode_attention_fp16.cu);
///  n8        — GQA ≤ 8: the query rows as the N side, 16-byte cp.async into
///              swizzled shared-memory rows, ldmatrix fragments
///              (decode_attention_fp16_n8.cu);
///  n8_fused  — the n8 kernel whose last CTA of each (sequence, KV head) merges
///              the split states itself (an arrival counter per (sequence, KV
///              head) in the workspace, zeroed by the query kernel): two
///              launches instead of three (query, attention, merge), for
///              short contexts where the merge launch is a large part of the
///              step (docs/cuda_results.md, session 8);
///  automatic — GQA ≤ 8: n8_fused when the split count is ≤ kFp16FusedMaxSplits
///              (each row's merge in the last CTA reads at most that many
///              states: a tail of about one L2 round trip per 8 splits),
///              else n8; GQA > 8: rows16.
enum class Fp16DecodeVariant { automatic, rows16, n8, n8_fused };

/// Largest split count at which Fp16DecodeVariant::automatic merges inside
/// the n8 kernel (n8_fused).
inline constexpr int kFp16FusedMaxSplits = 32;

/// Whether fp16_decode_attention(…, n_splits, …, variant) merges inside the
/// attention kernel (n8_fused) for these GQA and split counts (n_splits ≥ 1,
/// after the default).
bool fp16_fused_merge(int gqa, int n_splits, Fp16DecodeVariant variant);

/// Split count fp16_decode_attention uses for n_splits = 0 with `variant`
/// (size its workspace with decode_workspace_bytes(…, this)); ≥ 1, at most one
/// wave of the kernel's resident warps, ≥ 2 tiles of 16 tokens per split —
/// except that the n8 kernels get at least 4 splits (its CTA's 4 warps) when
/// the sequence has ≥ 8 tiles, also past one wave (large batches).
int fp16_default_splits(int batch, int n_kv_heads, int n_heads, int head_dim, int max_seq_len,
                        Fp16DecodeVariant variant = Fp16DecodeVariant::automatic);

/// The fp16 baseline of the same structure. Pages hold, per (page, KV head),
/// K (64, head_dim) then V (64, head_dim) fp16: page stride
/// n_kv_heads · 2 · 64 · head_dim · 2 bytes. Query scaled and rounded to fp16;
/// fp32 accumulation, P rounded to fp16. n_splits = 0 picks
/// fp16_default_splits(…, variant). Throws Error for GQA > 16 (n8, n8_fused:
/// > 8) or head_dim ∉ {64, 128, 256}.
void fp16_decode_attention(int n_heads, int n_kv_heads, int head_dim, const DecodeBatch& batch,
                           const uint16_t* pool, const void* q, DType q_dtype, float scale,
                           float* out, void* workspace, size_t workspace_bytes, int n_splits,
                           void* stream, Fp16DecodeVariant variant = Fp16DecodeVariant::automatic);

/// Quantize-append of one decode token per sequence, all KV heads: token
/// position seq_lens[b] (the length BEFORE the append) is written into its
/// page slot. Per group: n = ‖x_g‖, y = Π_g (x_g / n) in fp32, idx = number of
/// Lloyd–Max midpoints (fp32, ½(c_i + c_{i+1})) strictly below y, norm stored as
/// fp16(n). Only the token's own bits are touched (bitwise atomics), so pages
/// need not be zeroed. The caller advances seq_lens afterwards.
void packed_append(const PackedPlan& plan, const DecodeBatch& batch, uint8_t* pool, const void* k,
                   const void* v, DType dtype, void* stream);

/// How packed_prefill rotates K/V into the codebook domain:
///  tensor_cores — Y = X Π_gᵀ as one strided-batched cuBLAS GEMM per side
///                 (fp16 operands for fp16 inputs, TF32 for fp32 inputs; fp32
///                 accumulate and output), then the quantize kernel reads Y.
///                 Π rounded to fp16 (and fp32 x to TF32) moves y/‖x‖ by at
///                 most 2^-11 (fp16 inputs) / ≈ 2^-10 (fp32 inputs, both
///                 operands rounded) per coordinate, so a code can differ
///                 from the reference's by one level where y/‖x‖ lies that
///                 close to a midpoint (measured: 2–3.5e-4 of the codes on
///                 Gaussian data; tests/cuda bound it).
///  fp32         — Y computed in fp32 FMA by the quantize kernel (CUDA
///                 cores; the reference's codes up to fp32 summation order;
///                 4x (uniform) / 2.2x (Block-GTQ) slower at 32K–128K-token
///                 prompts on the H200: docs/cuda_results.md, session 7).
enum class PrefillVariant { tensor_cores, fp32 };

/// Caller-owned resources for packed_prefill's tensor_cores variant, so that
/// it allocates nothing (the GPU engine reserves them in its memory plan):
///   cublas — a cublasHandle_t already bound (cublasSetStream) to the stream
///            packed_prefill runs on, with its workspace set (cublasSetWorkspace
///            after cublasSetStream, which resets it);
///   buffer — device memory for the rotated rows Y of both sides (fp32),
///            `bytes` long: at least prefill_scratch_bytes(n_kv_heads,
///            head_dim, 64); prompts longer than it holds run in chunks.
struct PrefillScratch {
  void* cublas = nullptr;
  void* buffer = nullptr;
  size_t bytes = 0;
};

/// Bytes of the rotated-row buffer packed_prefill uses for a call of `rows`
/// rows (batch · n_tokens) of n_kv_heads heads of head_dim: min(rows rounded
/// up to 64, the ≤ 64 MiB chunk) · 2 · n_kv_heads · head_dim · 4. What
/// packed_prefill allocates itself without a PrefillScratch, and what a
/// PrefillScratch needs to run such a call in one chunk.
size_t prefill_scratch_bytes(int n_kv_heads, int head_dim, int64_t rows);

/// Quantize-prefill of a whole prompt chunk, one call per layer: for every
/// sequence b, the n_tokens vectors k[b, i], v[b, i] (i < n_tokens) are written
/// at positions seq_lens[b] + i (seq_lens = lengths BEFORE the prefill; 0 for a
/// fresh prompt), every KV head and group, with the quantizer of packed_append
/// (norms fp16(‖x_g‖); codes as packed_append's up to fp32 summation order at
/// a midpoint for variant fp32, up to the bound of PrefillVariant for
/// tensor_cores). Reference: ref::packed_prefill.
///   k, v : (batch, n_tokens, n_kv_heads, head_dim) fp32 or fp16
/// The page table must map every touched page. Only the written tokens' bits
/// change (partial first/last pages are merged with atomics). head_dim ≤ 256.
/// tensor_cores with `scratch` null allocates ≤ 64 MiB of stream-ordered
/// workspace (cudaMallocAsync, freed on the stream; longer prompts run in
/// chunks) and uses a cuBLAS handle (with its own 32 MiB workspace) per host
/// thread, device and stream, freed when the thread exits; with `scratch` it
/// allocates nothing and uses the caller's handle and buffer (PrefillScratch).
/// Throws Error on n_tokens < 1, bad pointers, a dtype other than fp32/fp16,
/// head_dim > 256, a plan with 5..8-bit groups, a plan without the prefill
/// rotation matrix of `dtype` (PrefillMatrices), a scratch buffer under 64
/// rows or a scratch handle bound to another stream, and a failed
/// allocation, cuBLAS call or launch. The caller advances seq_lens.
void packed_prefill(const PackedPlan& plan, const DecodeBatch& batch, uint8_t* pool,
                    const void* k, const void* v, int n_tokens, DType dtype, void* stream,
                    PrefillVariant variant = PrefillVariant::tensor_cores,
                    const PrefillScratch* scratch = nullptr);

}  // namespace ratekv::cuda
