// ratekv/format/stored_bytes.h — what a plan's KV cache stores, byte for byte:
// THE function every allocator, table, `ratekv plan` summary and the packed
// cache's measured bytes agree with (docs/design.md §3.2, §9.1; the page
// layouts are docs/packed_format.md §2, §3, §4, §5, §7; the plan schema
// include/ratekv/format/plan.h).
//
// Storage of each codec kind (per token, per (layer, KV head, side) unless said):
//   tq-mse, tq-mse-grouped  packed scalar pages (packed_format.h): a group of m
//                   channels at b bits stores 16·⌈m/16⌉·b code bits (padded to
//                   16-channel tiles; the padding is stored) + one 16-bit fp16
//                   norm; b = 5..8 adds the extension pages' norm array (16
//                   bits, allocated, never read; docs/packed_format.md §5);
//                   b = 0 stores nothing.
//   vq              vq pages (packed_vq_format.h): G·bits index bits, the head's
//                   segment rounded up to 16 bytes per 64-token page; with
//                   norm shared-fp16 one 128-byte scale array per page per
//                   layer side, shared by the layer's KV heads (16/H bits per
//                   head).
//   fp16            vq pages: 16·head_dim bits.
//   kivi, quarot    not paged: b·head_dim code bits + an fp16 scale and zero
//                   (32 bits) per group_size elements. KIVI keys group along
//                   tokens: the n mod group_size newest quantized rows of a
//                   sequence are fp16 (16·head_dim bits each) until their group
//                   fills — a per-sequence cost (at most group_size − 1 rows
//                   per (layer, KV head)), counted by stored_bytes_at().
//   q8_0, q4_0      ggml blocks of 32 values: 34 / 18 bytes.
// Sink tokens and the fp16 window are fp16 rows (16·head_dim bits per side),
// per sequence; the rest of a sequence is in whole 64-token pages (paged
// kinds) or exact bit counts (the others).
// Fixed per plan, not per token: the vq codebooks (G·2^bits·g fp16 values per
// vq codec; the side file stores them as fp16, VqTensors) and the key offsets
// (head_dim fp16 values per codec with an "offset", stored in the plan). TQ rotations and
// Lloyd–Max codebooks are regenerated from seeds and (m, b): 0 stored bytes.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "ratekv/format/plan.h"

namespace ratekv {

/// Stored bytes per 64-token page (packed::kPageTokens) by what they hold.
/// Whole numbers for every plan (a page is the unit the formats allocate).
struct StoredBytes {
  int64_t codes = 0;    ///< code / index bits, as bytes
  int64_t padding = 0;  ///< allocated, no information: tile padding of scalar groups, vq segment rounding to 16 bytes,
                        ///< the unused norm arrays of 5..8-bit groups' extension pages
  int64_t norms = 0;    ///< fp16 norms of TQ-MSE groups
  int64_t scales = 0;   ///< kivi/quarot scale + zero, q8_0/q4_0 block scales, vq shared fp16 scales
  int64_t fp16 = 0;     ///< fp16 rows of kind-fp16 sides
  int64_t total() const { return codes + padding + norms + scales + fp16; }
  /// Bytes per token: total() / 64.
  double per_token() const;
  StoredBytes& operator+=(const StoredBytes& o);
};

/// Stored bits per token of one TQ-MSE group of `channels` channels at `bits`
/// (0..8), as the packed format allocates them: 0 for bits = 0, else
/// 16·⌈channels/16⌉·bits + 16 (norm) + 16 when bits > 4 (the extension norm
/// array). Throws Error for channels < 1 or bits outside 0..8.
int64_t scalar_group_stored_bits(int channels, int bits);

/// Stored bytes per page of one codec (one KV head of one side) at head_dim;
/// a vq shared scale is charged once per layer side by layer_side_stored_bytes,
/// not here (see codec_stored_bits). Throws Error for an invalid codec
/// (Plan::validate's rules).
StoredBytes codec_stored_bytes(const Codec& c, int head_dim);

/// Stored bits per token of one codec including its share of a vq shared scale
/// (16 / scale_heads bits): Codec::effective_bits(d) · d. Exact in binary
/// floating point whenever scale_heads is a power of two.
double codec_stored_bits(const Codec& c, int head_dim);

/// Stored bytes per page of side `key` (true) or value (false) of `layer`:
/// Σ over KV heads of codec_stored_bytes, plus one 128-byte scale array when
/// the side's vq codecs share a per-token scale. Throws Error for a layer out
/// of range.
StoredBytes layer_side_stored_bytes(const Plan& p, int layer, bool key);

/// A plan's steady-state storage: per 64-token page, all layers and KV heads.
struct PlanStoredBytes {
  StoredBytes k, v;            ///< per page, summed over layers and KV heads
  int64_t elements = 0;        ///< n_layers · n_kv_heads · head_dim (per side, per token)
  /// Most bytes a sequence holds beyond its tokens' steady-state cost: the
  /// KIVI keys' unfilled token group, ≤ (group_size − 1) fp16 rows per (layer,
  /// KV head) (sink / window rows: plan_stored_bytes_at).
  int64_t per_sequence_max = 0;
  int64_t fixed_bytes = 0;     ///< per plan: vq codebooks and key offsets as fp16 (plan_fixed_bytes)
  double bytes_per_token() const { return (double)(k.total() + v.total()) / 64.0; }
  /// Stored bits per element of each side: 8 · bytes / (64 · elements).
  double k_bits_per_element() const;
  double v_bits_per_element() const;
  double bits_per_element() const { return 0.5 * (k_bits_per_element() + v_bits_per_element()); }
  /// {"bytes_per_token", "k_bytes_per_token", "v_bytes_per_token", "k_bits_per_element",
  ///  "v_bits_per_element", "k": {"codes", "padding", "norms", "scales", "fp16"} (bytes per token),
  ///  "v": {…}, "per_sequence_max_bytes", "fixed_bytes"}.
  nlohmann::json to_json() const;
};

/// The plan's storage per token (steady state: a long sequence in whole pages,
/// no sink or window). Throws Error for an invalid plan.
PlanStoredBytes plan_stored_bytes(const Plan& p);

/// Bytes of the vq codebooks of a plan, stored as fp16: Σ over vq codecs of
/// groups · 2^bits · group_size · 2 (the channel scales of a TaSQ side file
/// add 2·head_dim per codec that has them: VqTensors::stored_bytes()).
int64_t plan_codebook_bytes(const Plan& p);

/// Bytes of the key offsets of a plan, stored as fp16: 2·head_dim per codec
/// with an "offset" (plan.h).
int64_t plan_offset_bytes(const Plan& p);

/// Everything a plan stores once, not per token: plan_codebook_bytes +
/// plan_offset_bytes.
int64_t plan_fixed_bytes(const Plan& p);

/// Exact bytes a cache holding `n_tokens` tokens of one sequence stores:
/// min(n, sink) sink rows and the fp16 window's rows as fp16; the quantized
/// region (n − sink − window tokens, if positive) in ⌈·/64⌉ whole pages for the
/// paged kinds (tq-mse, tq-mse-grouped, vq, fp16) and in exact bits for the
/// others, KIVI keys' unfilled token group as fp16 rows. Sink and window as in
/// the plan unless overridden (≥ 0). Returned as a double of whole eighths
/// (bits / 8). Throws Error for n_tokens < 0 or an invalid plan.
double plan_stored_bytes_at(const Plan& p, int64_t n_tokens, int sink_tokens = -1, int fp16_window = -1);

}  // namespace ratekv
