// ratekv/format/packed_vq_format.h — the vq pages of the packed KV-cache format:
// vector-quantized sides (TaSQ / CQ plans, codec kind "vq", docs/design.md §5.5) and
// fp16 sides, their layout arithmetic and the scalar reference
// encoder/decoder that DEFINE them. Specification: docs/packed_format.md §7.
//
// Summary (P = kPageTokens = 64 token slots per page, all KV heads of a layer):
//  * A layer side (K or V) is stored in the vq pages when its codecs are "vq"
//    (all KV heads of the layer side are, PlanCodecs) or "fp16"; scalar
//    TQ-MSE sides stay in the scalar pages (packed_format.h) under the same
//    page table (logical page i = tokens [64i, 64i+64) in both).
//  * Page = head blocks h = 0..H−1, each [K segment][V segment], then the
//    shared-scale arrays [K scales][V scales] (one PageNorms each, present
//    only for a vq side with a shared scale). Every segment starts at a
//    multiple of 16 bytes (padding bytes are 0, never read).
//  * vq segment of one (KV head, side): the page's 64·G indices of `bits` bits
//    (G = head_dim / g groups, bits 1..16) as one little-endian bit stream,
//    slot-major: index (slot t, group gi) occupies stream bits
//    [(t·G + gi)·bits, (t·G + gi + 1)·bits), its bit j at stream bit
//    p = (t·G + gi)·bits + j = bit p mod 8 of byte ⌊p/8⌋. No padding between
//    indices (10-bit indices take 10 bits). 8·G·bits bytes, rounded up to 16.
//  * fp16 segment: 64 rows of head_dim IEEE binary16 values, (slot t,
//    channel c) at byte 2·(t·head_dim + c), little endian. 128·head_dim bytes.
//  * Scale array (vq with norm "shared-fp16"): slot t's fp16 scale s_t at
//    byte 2t — ONE per token per layer side, shared by all KV heads.
//  * Decoding (VqCodec, cache/vq_codec.h): x̂[G_gi] = s_t · C̃_gi[z_{t,gi}]
//    (s_t = 1 without a shared scale), in the original channel order; keys
//    are pre-RoPE: RoPE at the token's position with the layer's base.
// Codebooks and channel scales are a fixed per-plan cost (the plan's side
// file), not in the pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ratekv/format/packed_format.h"

namespace ratekv::packed {

inline constexpr int kVqMaxBits = 16;  ///< widest vq index (K ≤ 65536 centroids)
inline constexpr size_t kVqAlign = 16; ///< every segment starts at a multiple of this

/// How one layer side is stored in the vq pages.
enum class VqSideKind : uint8_t {
  none = 0,  ///< not in the vq pages (scalar format pages, or nothing)
  vq = 1,    ///< G indices of `bits` bits per token per KV head (+ shared scale)
  fp16 = 2,  ///< head_dim fp16 values per token per KV head
};

/// One layer side of the vq pages (the same for every KV head of the layer).
struct VqSideSpec {
  VqSideKind kind = VqSideKind::none;
  int n_groups = 0;           ///< vq: G = head_dim / group_size (≥ 1)
  int bits = 0;               ///< vq: index width, 1..kVqMaxBits (K = 2^bits)
  bool shared_scale = false;  ///< vq: one fp16 scale per token per layer side
};

/// Byte layout of one layer's vq pages. Immutable.
class VqLayerLayout {
 public:
  /// Throws ratekv::Error for head_dim or n_kv_heads ≤ 0, a vq side with
  /// n_groups < 1 or bits outside 1..16, or vq fields set on a non-vq side.
  VqLayerLayout(int head_dim, int n_kv_heads, VqSideSpec key, VqSideSpec value);

  int head_dim() const { return head_dim_; }
  int n_kv_heads() const { return n_kv_heads_; }
  const VqSideSpec& side(Side s) const { return s == Side::key ? key_ : value_; }
  /// True when neither side is stored here (page_bytes() == 0).
  bool empty() const { return page_bytes_ == 0; }
  /// Bytes of one side's segment of one KV head per page (0 for none):
  /// vq 8·G·bits rounded up to 16; fp16 128·head_dim.
  size_t segment_bytes(Side s) const { return seg_bytes_[static_cast<int>(s)]; }
  /// Byte offset of KV head h's segment of side s from the page start.
  size_t segment_offset(int h, Side s) const;
  /// Byte offset of side s's scale array (PageNorms) from the page start;
  /// Error when the side has no shared scale.
  size_t scale_offset(Side s) const;
  /// Bytes of one page (all KV heads, both sides, scale arrays); multiple of 16.
  size_t page_bytes() const { return page_bytes_; }
  /// Exact stored bytes per token of the layer (all KV heads, both sides),
  /// without page padding: Σ_sides H·G·bits/8 (+ 2 with a shared scale) or
  /// H·2·head_dim (fp16).
  double bytes_per_token() const;

 private:
  int head_dim_, n_kv_heads_;
  VqSideSpec key_, value_;
  size_t seg_bytes_[2] = {0, 0};
  size_t head_bytes_ = 0;
  size_t scale_off_[2] = {0, 0};
  size_t page_bytes_ = 0;
};

// ---- scalar reference writer / reader (define the format) --------------------

/// Writes the G indices of slot `slot` (0..63) of KV head h's vq segment of
/// side s into `page` (page_bytes() bytes), bit by bit: only the slot's own
/// bits change. Throws Error for a non-vq side, idx.size() ≠ G, an index
/// outside [0, 2^bits), or an out-of-range h / slot / page size.
void write_vq_indices(const VqLayerLayout& L, std::span<uint8_t> page, int h, Side s, int slot,
                      std::span<const int32_t> idx);
/// Reads back the G indices written by write_vq_indices.
void read_vq_indices(const VqLayerLayout& L, std::span<const uint8_t> page, int h, Side s, int slot,
                     std::span<int32_t> idx);
/// Writes / reads the fp16 bits of slot's shared scale of side s.
void write_vq_scale(const VqLayerLayout& L, std::span<uint8_t> page, Side s, int slot, uint16_t scale_fp16);
uint16_t read_vq_scale(const VqLayerLayout& L, std::span<const uint8_t> page, Side s, int slot);
/// Writes / reads the head_dim fp16 values of slot of KV head h of an fp16 side.
void write_fp16_row(const VqLayerLayout& L, std::span<uint8_t> page, int h, Side s, int slot,
                    std::span<const uint16_t> row);
void read_fp16_row(const VqLayerLayout& L, std::span<const uint8_t> page, int h, Side s, int slot,
                   std::span<uint16_t> row);

}  // namespace ratekv::packed
