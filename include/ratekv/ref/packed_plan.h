// ratekv/ref/packed_plan.h — a packed layer's rotations and codebooks on the
// host, in the order and with the arguments the GPU plan takes them
// (cuda::PackedPlan, include/ratekv/cuda/decode_attention.h), for the CPU
// references of the packed kernels (ref/packed_decode_attention.h,
// ref/packed_quantize.h). Format: docs/packed_format.md §1–§6.
//
//   rotations: for h in KV heads, side in (key, value), group g of that side
//              of `layout`: Π_g, dim × dim fp32 row-major (y = Π u, so
//              x̂ = n Π_gᵀ c[idx]); concatenated.
//   levels:    same order, 2^b fp32 Lloyd–Max levels, strictly ascending; b
//              is the group's code width: its bits in `layout`, or for a
//              5..8-bit group (low 4 bits in `layout`, high b − 4 bits in
//              the extension layout, docs/packed_format.md §5) the sum.
// Unlike cuda::PackedPlan there are no kernel limits (any head_dim, GQA,
// group count the layout allows).
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "ratekv/format/packed_format.h"

namespace ratekv::ref {

class PackedPlan {
 public:
  /// A plan of 1..4-bit groups. Throws Error when n_heads is not a positive
  /// multiple of layout.n_kv_heads(), a span's length differs from what the
  /// layout needs (message names the KV head, side and group), a rotation
  /// entry is not finite, or a group's levels are not finite and strictly
  /// ascending.
  PackedPlan(const packed::LayerLayout& layout, int n_heads, std::span<const float> rotations,
             std::span<const float> levels);
  /// A plan with 5..8-bit groups: `ext` holds the high parts, per KV head and
  /// side in the order of the wide groups of `layout` — extension group e
  /// belongs to the first 4-bit group of `layout` with the same channel list
  /// not yet taken (as cuda::PackedPlan and the CPU packed cache match them).
  /// Throws Error besides the above when ext has another head_dim or KV head
  /// count, or an extension group has no such 4-bit group.
  PackedPlan(const packed::LayerLayout& layout, const packed::LayerLayout& ext, int n_heads,
             std::span<const float> rotations, std::span<const float> levels);

  const packed::LayerLayout& layout() const { return layout_; }
  /// The extension layout of a plan with 5..8-bit groups, else nullptr.
  const packed::LayerLayout* ext_layout() const { return ext_ ? &*ext_ : nullptr; }
  int n_heads() const { return n_heads_; }
  int head_dim() const { return layout_.head_dim(); }
  int n_kv_heads() const { return layout_.n_kv_heads(); }
  int gqa() const { return n_heads_ / layout_.n_kv_heads(); }
  /// Whether any group has 5..8 bits.
  bool has_wide() const { return has_wide_; }

  /// Π of group g of side s of KV head h: dim × dim, row-major.
  std::span<const float> rotation(int h, packed::Side s, int g) const;
  /// The group's 2^bits(h, s, g) levels.
  std::span<const float> levels(int h, packed::Side s, int g) const;
  /// The group's code width, 1..8.
  int bits(int h, packed::Side s, int g) const { return at(h, s, g).bits; }
  /// The extension group holding the high bits of a 5..8-bit group, or −1.
  int ext_group(int h, packed::Side s, int g) const { return at(h, s, g).ext_group; }

 private:
  struct Entry {
    size_t rot = 0, lvl = 0;  // offsets into rot_ / lvl_
    int bits = 0, ext_group = -1;
  };
  void build(std::span<const float> rotations, std::span<const float> levels);
  const Entry& at(int h, packed::Side s, int g) const;

  packed::LayerLayout layout_;
  std::optional<packed::LayerLayout> ext_;
  int n_heads_;
  bool has_wide_ = false;
  std::vector<float> rot_, lvl_;
  std::vector<std::vector<Entry>> entries_;  // [h · 2 + side][group]
};

}  // namespace ratekv::ref
