// ratekv/ref/vq_plan.h — a layer's vq-page tables on the host (codewords,
// channel lists, RoPE, the scalar value side), with the arguments the GPU
// plan takes them (cuda::VqPlan, include/ratekv/cuda/decode_attention.h),
// for ref::vq_decode_attention. Pages: docs/packed_format.md §7.
//
//   codewords: for h in KV heads, side in (key, value) whose kind is vq:
//              (G, 2^bits, g) fp32 reconstruction codewords C̃ = C / a
//              (channel weights folded in, cache::VqCodec), concatenated;
//   channels:  same order, (G, g) int32: the head channel of coordinate i of
//              group gi (each channel of the head exactly once).
// The key side is in the vq pages (kind vq or fp16). The value side is in
// the vq pages too, or — kind none — a scalar TQ-MSE side in the layer's
// scalar pages, given as `scalar_values` (a PackedPlan with no key groups,
// kept alive by the caller).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ratekv/format/packed_vq_format.h"
#include "ratekv/ref/packed_plan.h"

namespace ratekv::ref {

/// RoPE of vq keys (quantized pre-RoPE, rotated at the key's position in
/// attention; docs/design.md §5), as ratekv::apply_rope: block i = channels
/// (2i, 2i+1) (interleaved) or (i, i + d/2) (neox), angle pos · θ^(−2i/d) in
/// double, cos/sin rounded to fp32.
struct VqRope {
  bool neox = false;
  double theta = 10000.0;  ///< the layer's RoPE base (> 0, finite)
};

class VqPlan {
 public:
  /// Throws Error on wrong span lengths, a channel list that is not a
  /// permutation of the head's channels, non-finite codewords, n_heads not a
  /// positive multiple of n_kv_heads, an odd head_dim with vq keys, a bad
  /// RoPE base, a key side not in the vq pages, or a value side in neither
  /// page kind / a scalar plan that does not match (head_dim, KV heads,
  /// n_heads, key groups, 5..8-bit groups).
  VqPlan(const packed::VqLayerLayout& layout, int n_heads, std::span<const float> codewords,
         std::span<const int32_t> channels, VqRope rope, const PackedPlan* scalar_values = nullptr);

  const packed::VqLayerLayout& layout() const { return layout_; }
  /// The scalar TQ-MSE value side's plan, or nullptr.
  const PackedPlan* scalar_values() const { return scalar_; }
  const VqRope& rope() const { return rope_; }
  int n_heads() const { return n_heads_; }
  int head_dim() const { return layout_.head_dim(); }
  int n_kv_heads() const { return layout_.n_kv_heads(); }
  int gqa() const { return n_heads_ / layout_.n_kv_heads(); }
  /// Codewords (G, 2^bits, g) of KV head h's side s (a vq side).
  std::span<const float> codewords(int h, packed::Side s) const;
  /// Channel lists (G, g) of KV head h's side s (a vq side).
  std::span<const int32_t> channels(int h, packed::Side s) const;

 private:
  packed::VqLayerLayout layout_;
  const PackedPlan* scalar_ = nullptr;
  VqRope rope_;
  int n_heads_;
  std::vector<float> cw_;
  std::vector<int32_t> ch_;
  std::vector<size_t> cw_off_, ch_off_;  // [h · 2 + side]
};

}  // namespace ratekv::ref
