// ratekv/cuda/vq_encode.h — CUDA (sm_90) encoder of the vq pages
// (docs/packed_format.md §7): TaSQ / CQ sides (codec kind vq) and fp16 sides
// of a layer written on the GPU, for the engine's decode append and prefill.
//
// Specification: the scalar reference encoder cache::encode_vq_token /
// cache::vq_token_scale (include/ratekv/cache/vq_page_codec.h) through the
// format's reference writer (include/ratekv/format/packed_vq_format.h), i.e.
// cache::VqCodec::encode:
//   s   = fp16(sqrt(Σ_h Σ_c (a_c x_c)² / (H·d)))  (shared scale, double sum;
//         1 without one; the smallest fp16 subnormal when it rounds to 0)
//   y_c = (a_c · x_c) · (1/s)                     (fp32, in that order)
//   z_G = argmin_j Σ_i (y_{G_i} − C_G[j]_i)²      (fp32, i in order, each term
//         added as fma(e, e, Σ); ties → lowest j)
// The kernel does the same fp32 operations in the same order (IEEE-rounded
// intrinsics, __fmaf_rn), so the indices equal the reference's for equal s. The shared scale's double sum is reduced in another order (a tree over
// the H·d terms): it differs from the reference's sequential sum by a few
// units in the last place of a double (relative ≲ H·d·2⁻⁵³), so the fp16
// scale can differ only when the RMS lies that close to an fp16 rounding
// boundary (never met in tests/cuda/test_vq_encode.cpp). fp16 sides: each
// value rounded to fp16 (nearest even), as packed::write_fp16_row's callers do.
//
// Only the written tokens' bits change (indices of tokens of one page share
// bytes: written with bitwise atomics on 32-bit words), so pages need not be
// zeroed. Device pointers; asynchronous on `stream` (a cudaStream_t as void*).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

/// A layer's vq-page sides uploaded for vq_append.
///   codebooks:     for h in KV heads, side in (key, value) whose kind is vq:
///                  (G, 2^bits, g) fp32 codebooks C in the weighted space
///                  (cache::VqCodec::codebooks(), NOT the reconstruction
///                  codewords C̃ that VqPlan takes), concatenated;
///   channel_scale: same order, head_dim fp32 weights a_c (all ones for
///                  unweighted codecs, cache::VqCodec::channel_scale());
///   channels:      same order, (G, g) int32 head channels of the groups
///                  (cache::VqCodec::group_channels), a permutation of 0..d−1.
/// A side of kind none (a scalar TQ-MSE side in the layer's scalar pages) is
/// skipped by vq_append. Throws Error on wrong span lengths, a channel list
/// that is not a permutation, non-finite codebooks, a channel scale ≤ 0,
/// head_dim > 256, or n_kv_heads · head_dim > 8192 (one token's row in
/// shared memory).
class VqEncodePlan {
 public:
  VqEncodePlan(const packed::VqLayerLayout& layout, std::span<const float> codebooks,
               std::span<const float> channel_scale, std::span<const int32_t> channels);
  ~VqEncodePlan();
  VqEncodePlan(const VqEncodePlan&) = delete;
  VqEncodePlan& operator=(const VqEncodePlan&) = delete;

  const packed::VqLayerLayout& layout() const { return *layout_; }
  int head_dim() const { return head_dim_; }
  int n_kv_heads() const { return n_kv_heads_; }

  struct Device;  ///< device-side tables (opaque)
  const Device& device() const { return *dev_; }
  /// Bytes of device memory this plan allocated; equals
  /// vq_encode_plan_device_bytes(n_kv_heads(), head_dim(), codebooks.size()).
  size_t device_bytes() const { return device_bytes_; }

 private:
  std::unique_ptr<packed::VqLayerLayout> layout_;
  int head_dim_, n_kv_heads_;
  size_t device_bytes_ = 0;
  std::unique_ptr<Device> dev_;
};

/// Device bytes a VqEncodePlan over n_kv_heads heads of head_dim with
/// `n_codebook` codebook floats allocates (no GPU needed; the GPU engine's
/// memory plan): the codebooks (fp32), per (KV head, side, channel) a scale
/// (fp32) and a channel index (int32), per (KV head, side) a codebook offset
/// (int64), and the 4-byte error flag.
size_t vq_encode_plan_device_bytes(int n_kv_heads, int head_dim, size_t n_codebook);

/// Writes n_tokens tokens of every sequence b of `batch` into the layer's vq
/// pages `pool` (layout().page_bytes() each, under batch.page_table): token i
/// at position seq_lens[b] + i (seq_lens = lengths BEFORE the write; decode
/// append is n_tokens = 1). Per side in the vq pages: vq keys encode k_pre
/// (pre-RoPE), fp16 keys store k (post-RoPE), values v (vq or fp16); sides of
/// kind none are not touched (k_pre / k may be nullptr when no side reads it).
///   k_pre, k, v : (batch, n_tokens, n_kv_heads, head_dim) fp32
/// The page table must map every touched page. A token whose shared scale is
/// not a finite fp16 value (the CPU reference throws) is written with scale
/// 65504 and raises the plan's error flag: vq_check_status reports it.
/// Throws Error on n_tokens < 1, bad pointers or a failed launch. The caller
/// advances seq_lens.
void vq_append(const VqEncodePlan& plan, const DecodeBatch& batch, uint8_t* pool, const float* k_pre,
               const float* k, const float* v, int n_tokens, void* stream);

/// Synchronizes `stream` and throws Error (naming `what`, e.g. "GPU engine:
/// layer 3") when a vq_append since the last call met a shared scale that is
/// not a finite fp16 value; clears the flag.
void vq_check_status(const VqEncodePlan& plan, void* stream, const char* what);

}  // namespace ratekv::cuda

namespace ratekv::cuda {

/// The reconstructions of the vq pages' sides of n_tokens tokens of one
/// sequence, as fp16 (what evaluation-mode and chunked prefill attend to):
/// token i lives in slot i mod 64 of page page_table[i / 64] (page_table: the
/// sequence's row from the first page read) at position pos0 + i.
///   k16 (n_tokens, Hkv, hd): vq keys RoPE_{pos0+i}(s · C̃[z]) (RoPE as
///       vq_decode_attention: angle in double, cos/sin rounded to fp32), fp16
///       keys as stored; written when the key side is in the vq pages;
///   v16 (n_tokens, Hkv, hd): s · C̃[z] or the fp16 row; written when the
///       value side is in the vq pages (a scalar value side: packed_dequantize
///       with the layer's value plan).
/// fp32 arithmetic rounded to fp16 once. Throws Error on n_tokens < 1, pos0 <
/// 0 or a null pointer the plan needs.
void vq_dequantize(const VqPlan& plan, const uint8_t* pool, const int32_t* page_table, int n_tokens, int pos0,
                   uint16_t* k16, uint16_t* v16, void* stream);

}  // namespace ratekv::cuda
