// ratekv/cache/packed_kv_cache.h — a KV cache that really stores codes in the
// packed format (docs/packed_format.md) and computes attention from them
// (docs/design.md §6).
//
// Serves TQ-MSE-family plans, TaSQ / CQ plans and fp16 sides: every (layer,
// KV head, side) codec must be "tq-mse" (one group over the head),
// "tq-mse-grouped" (Block-GTQ, RateQuant over TQ-MSE), each (layer, KV head,
// side) with its own widths (RateQuant plans give every head and side its own
// width), "vq" or "fp16" (both: every KV head of that layer side; stored in
// the layer's vq pages, docs/packed_format.md §7, packed_vq_format.h). Any
// other kind (kivi, quarot, q8_0, q4_0) is rejected with an Error naming the
// kind and the plan field.
// vq sides: per token per KV head G indices of `bits` bits (tightly packed)
// and, with a shared scale, one fp16 scale per token per layer side, written
// by the format's reference encoder (VqCodec::encode: the fake-quant path's
// indices). vq keys are quantized pre-RoPE (append's k_pre, required); in
// attention each stored key row of KV head h is decoded (s · C̃[z]), rotated
// by RoPE at its position with the layer's base, and dotted with the GQA
// query rows; vq value rows are decoded and accumulated in the original
// channel order. fp16 sides store fp16 rows (keys post-RoPE). One row at a
// time, never the whole cache. Scalar widths:
//   0 bits   groups at 0 bits are dropped (reconstructed as 0, as the
//            fake-quant cache does); a side whose every group is at 0 bits
//            stores nothing: its keys score 0 (softmax weight e^0 per token),
//            its values contribute 0;
//   1..4     one format group (docs/packed_format.md);
//   5..8     wider than the format's nibbles: the code's low 4 bits are a
//            4-bit format group in the layer's pages, its high b − 4 bits a
//            (b−4)-bit format group over the same channels in the layer's
//            extension pages (a second LayerLayout holding only such groups,
//            same page table); code = low | high << 4. b bits per code in all.
//            CPU only (the CUDA kernels read the main pages).
//
// Storage per layer: pages of packed::kPageTokens code slots (one page = all
// KV heads, LayerLayout built from the layer's groups), allocated one at a
// time as tokens arrive; a page table (logical page → page); token regions as
// in FakeQuantKVCache:
//   [0, S)            sink tokens: fp16 rows (uint16), kept forever
//   [S, max(S, T−W))  quantized: codes + fp16 norms in the pages (slot t − S)
//   [max(S, T−W), T)  fp16 window: attention reads the rows rounded to fp16;
//                     the cache keeps the appended fp32 rows (W · row floats,
//                     bounded) so a token leaving the window is quantized
//                     from its original values, exactly as FakeQuantKVCache.
// bytes() = pages + sink rows + window rows + positions, all as allocated.
//
// Attention (never expands the cache): for each KV head the query rows of
// its GQA heads are rotated once per key group (q_rot = Π_g q[channels_g]).
// Per page the codes are unpacked once per KV head and shared by all rows:
//   * few rows (decode): key scores from a per-step table
//     tab[i][j] = q_rot[i] · c[j] (m × 2^b per group and row),
//     s_t = Σ_g n_{g,t} Σ_i tab_g[i][idx_{t,i}];
//   * many rows (prefill): codes → levels tile n_t·c[idx] (m × 64), once
//     per page, and S = Q_rot · tile (vectorized axpy loops).
// Decode fast path (AVX2, groups of ≤ 4 bits, default): no per-element
// unpacking and no table gathers. Per page and channel tile the b lane words
// become "nibble words" (nibble e = code of fragment element e, one shift and
// mask); a 16×16 tile's row x is then four 16-bit halves of four lane words:
// 16 codes, in a fixed "natural" order k ↔ column 2(k/4) + k mod 2 +
// 8((k/2) mod 2). Those codes index the codebook with two 8-lane permutes
// (_mm256_permutevar8x32_ps; a blend on bit 3 for 16 levels). Keys: row x =
// token, the levels are dotted with the rotated query held in natural order
// (FMA). Values: the value tile is the key tile transposed, so row x =
// channel and the levels of 16 tokens are dotted with p_t·n_t in natural
// order, then added to o_rot[channel]. The scalar path (unpack_codes + table
// lookups) stays as the reference (PackedCacheOptions::reference_attention)
// and serves 5..8-bit groups and builds without AVX2/FMA.
// Values are accumulated in each group's rotated domain (o_rot += p_t n_t
// c[idx_t]) and rotated back once per output row (x = Π_gᵀ o_rot). The key
// range is split over the sequence (pages) into parts with partial states
// {o, m, l} (flash-decoding; SoftmaxState, ratekv/model/attention_state.h,
// the DenseKVCache's key range and logit too) merged by log-sum-exp; OpenMP over (KV head,
// part) for decode and (KV head, query block) for prefill.
//
// Sources (src/cache/): packed_kv_cache.cpp (layouts, append, bytes),
// packed_attention.cpp (work items, merge, the per-page driver attend_rows),
// packed_attention_avx2.cpp (fast path), packed_attention_scalar.cpp (scalar
// path), packed_codes.cpp (pack_token_codes / unpack_codes); shared internals
// in packed_attention_kernels.h. The GPU decode kernel's named CPU reference
// is ref::packed_decode_attention (include/ratekv/ref/); tests/cache checks
// this cache's decode attention against it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/model/attention_state.h"
#include "ratekv/model/kv_cache.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/format/packed_vq_format.h"
#include "ratekv/quant/tq_mse.h"

namespace ratekv::cache {

struct PackedCacheOptions {
  std::optional<int> fp16_window;  ///< overrides plan.fp16_window (≥ 0)
  std::optional<int> sink_tokens;  ///< overrides plan.sink_tokens (≥ 0)
  /// Decode attention splits a KV head's pages into parts of at least this
  /// many pages (partial states merged by log-sum-exp). ≥ 1.
  int pages_per_split = 8;
  /// Use the scalar reference attention (unpack_codes + per-step tables)
  /// instead of the AVX2 decode fast path (tests compare the two).
  bool reference_attention = false;
};

class PackedKVCache final : public KVCache {
 public:
  /// Throws Error when `shape` (layers, KV heads, head_dim) differs from the
  /// codecs' model, a codec kind is not tq-mse / tq-mse-grouped (message
  /// names the kind and the plan field), a group width is outside 0..8, or a
  /// window/sink override is negative.
  PackedKVCache(const KVCacheShape& shape, std::shared_ptr<const PlanCodecs> codecs,
                PackedCacheOptions opt = {});
  /// Copies are deep (pages included) and share the plan codecs: e.g. a
  /// prefilled prompt prefix continued by several suffixes (ratekv niah).
  PackedKVCache(const PackedKVCache&) = default;

  const KVCacheShape& shape() const override { return shape_; }
  /// Quantizes the n new tokens of every KV head (prefill: the whole chunk in
  /// one call, OpenMP over KV heads) and writes codes + fp16 norms into pages.
  /// Throws Error for a bad layer, n, position order or capacity, and when a
  /// group's norm (or a vq scale) overflows fp16 (|x| too large for the format);
  /// after an error the layer holds exactly what it held before the call.
  void append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
              const float* v) override;
  /// Every check append() makes before it writes (layer, n, position order, capacity, finite K/V, group
  /// norms within fp16), without writing: a caller that appends to several caches (a batch of sequences)
  /// checks all of them first, so one bad sequence leaves none written. Same arguments and Errors as
  /// append(); a vq scale overflow is found only by append() itself.
  void check_append(int layer, int64_t n, const int32_t* pos, const float* k_post, const float* v) const;
  /// Causal attention of n queries over the cached tokens, from the codes
  /// (see the file comment). Same rules and errors as DenseKVCache::attend.
  void attend(int layer, int64_t n, const int32_t* pos, const float* q, float* out,
              const AttnParams& params) override;
  int64_t n_tokens() const override;
  void clear() override;
  /// Bytes held: allocated pages + sink/window rows + positions.
  size_t bytes() const override;
  /// Bytes of the allocated code pages only (all layers, extension pages of
  /// 5..8-bit groups included).
  size_t page_bytes() const;

  const PlanCodecs& codecs() const { return *codecs_; }
  const packed::LayerLayout& layout(int layer) const { return layers_.at(layer).layout; }
  /// Physical page of logical page i of `layer` (read-only view).
  std::span<const uint8_t> page(int layer, int i) const;
  /// The extension layout of `layer` (high bits of its 5..8-bit groups), or
  /// nullptr when the layer has none.
  const packed::LayerLayout* ext_layout(int layer) const;
  /// Extension page i of `layer` (Error when the layer has no extension).
  std::span<const uint8_t> ext_page(int layer, int i) const;
  /// The vq-page layout of `layer` (its vq and fp16 sides, docs/packed_format.md
  /// §7), or nullptr when the layer has none.
  const packed::VqLayerLayout* vq_layout(int layer) const;
  /// vq page i of `layer` (Error when the layer has no vq pages).
  std::span<const uint8_t> vq_page(int layer, int i) const;
  /// Tokens of `layer` stored as codes.
  int64_t n_quantized(int layer) const { return layers_.at(layer).n_codes; }
  int fp16_window() const { return window_; }
  int sink_tokens() const { return sink_; }

 private:
  struct Group {                   // one channel group of one side of one KV head
    const quant::TQMSE* tq = nullptr;
    std::vector<int> channels;     // head channels, code i ↔ channels[i]
    const float* levels = nullptr; // Lloyd–Max levels (2^bits)
    std::array<float, 16> lv16{};  // levels padded to 16 (fast path, bits ≤ 4)
    int dim = 0, dim_pad = 0, bits = 0;
    size_t code_offset = 0, norm_offset = 0;  // within a page (head block included)
    int rot_offset = 0;            // start of this group in the per-side rotated vector
    bool wide = false;             // bits > 4: low nibble here, high bits in the extension pages
    packed::GroupLayout ext;       // wide: the high part's layout (code_offset within the ext head block)
    size_t ext_code_offset = 0;    // wide: within an extension page (head block included)
  };
  struct Head {
    std::array<std::vector<Group>, 2> side;  // key, value
    std::array<int, 2> rot_dim{0, 0};        // Σ dims per side
  };
  struct Layer {
    packed::LayerLayout layout;
    std::vector<Head> heads;
    std::vector<std::vector<uint8_t>> pages;        // page table: logical i → pages[i] (copyable: clone)
    std::optional<packed::LayerLayout> ext_layout;   // high bits of 5..8-bit groups, if any
    std::vector<std::vector<uint8_t>> ext_pages;        // same page table (logical i → ext_pages[i])
    int64_t n_codes = 0;               // tokens stored as codes
    std::vector<uint16_t> sink_k, sink_v;  // (≤ S, n_kv_heads, head_dim) fp16 bits
    std::vector<float> win_k, win_v;       // (tokens in window, n_kv_heads, head_dim) fp32 originals
    int64_t win_start = 0;                 // token index of win_k row 0
    std::vector<int32_t> pos;
    // vq / fp16 sides (docs/packed_format.md §7): layout, pages under the same
    // page table, the layer side's codecs ([side][KV head], vq sides only).
    std::optional<packed::VqLayerLayout> vq_layout;
    std::vector<std::vector<uint8_t>> vq_pages;
    std::array<std::vector<const VqCodec*>, 2> vq_heads;
    std::vector<float> win_kpre;           // vq keys: pre-RoPE originals of the window rows
    double rope_theta = 0;                 // the layer's RoPE base (vq keys are rotated at attention)
  };

  bool vq_side(const Layer& L, int s) const {
    return L.vq_layout && L.vq_layout->side(static_cast<packed::Side>(s)).kind != packed::VqSideKind::none;
  }
  // Throws Error for a non-finite K/V element or a group norm beyond fp16 in the n new rows (nothing stored yet).
  void check_rows(const Layer& L, int layer, int64_t n, const float* k_post, const float* v) const;
  // append() after its argument checks: sink rows, window, quantization of the rows leaving the window.
  void append_rows(Layer& L, int layer, int64_t T0, int64_t n, const int32_t* pos, const float* k_pre,
                   const float* k_post, const float* v);
  void quantize_rows(Layer& L, int layer, const float* k, const float* k_pre, const float* v, int64_t n);
  void quantize_vq_rows(Layer& L, const float* k, const float* k_pre, const float* v, int64_t c0, int64_t n);
  // Codes of slots [0, n_slots) of group g of side s of head hk in logical
  // page pg, (n_slots rounded up to 16, dim_pad) u8 (reference path).
  void unpack_group(const Layer& L, int hk, int s, size_t g, int64_t pg, int n_slots, uint8_t* codes,
                    uint8_t* tmp) const;
  void attend_rows(const Layer& L, int hk, int64_t rows, const float* q_orig, const float* q_rot,
                   const int64_t* lo, const int64_t* hi, int64_t a, int64_t b, const AttnParams& p,
                   SoftmaxState* s, float* o_rot, float* o_plain) const;

  KVCacheShape shape_;
  std::shared_ptr<const PlanCodecs> codecs_;
  PackedCacheOptions opt_;
  int window_ = 0, sink_ = 0;
  std::vector<Layer> layers_;
};

// ---- fast paths of the packed format, tested against the scalar reference ---

/// Writes the codes of one token slot of one group (codes[i] for rotated
/// coordinate i < G.dim; padding written as 0) into the group's code segment
/// `seg` (G.code_bytes bytes). Same bytes as packed::write_codes. Codes must be
/// < 2^bits (not checked: the quantizer produced them).
void pack_token_codes(const packed::GroupLayout& G, packed::Side side, uint8_t* seg, int slot,
                      const uint8_t* codes);

/// Unpacks the codes of tokens [0, n_slots) of a group's code segment into
/// codes (n_slots rounded up to 16, dim_pad) row-major u8. Same values as
/// packed::read_codes for the written slots.
void unpack_codes(const packed::GroupLayout& G, packed::Side side, const uint8_t* seg, int n_slots,
                  uint8_t* codes);

}  // namespace ratekv::cache
