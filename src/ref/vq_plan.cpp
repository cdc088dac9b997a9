// ref::VqPlan (include/ratekv/ref/vq_plan.h).
#include "ratekv/ref/vq_plan.h"

#include <cmath>

#include "ratekv/common/error.h"

namespace ratekv::ref {

using packed::Side;
using packed::VqSideKind;

namespace {
const char* side_name(int s) { return s == 0 ? "key" : "value"; }
}  // namespace

VqPlan::VqPlan(const packed::VqLayerLayout& layout, int n_heads, std::span<const float> codewords,
               std::span<const int32_t> channels, VqRope rope, const PackedPlan* scalar_values)
    : layout_(layout), scalar_(scalar_values), rope_(rope), n_heads_(n_heads) {
  const int d = layout.head_dim(), hkv = layout.n_kv_heads();
  check(n_heads > 0 && n_heads % hkv == 0, "ref vq plan: n_heads {} is not a positive multiple of n_kv_heads {}",
        n_heads, hkv);
  check(std::isfinite(rope.theta) && rope.theta > 0, "ref vq plan: RoPE base {} must be positive and finite",
        rope.theta);
  const VqSideKind kk = layout.side(Side::key).kind, vk = layout.side(Side::value).kind;
  check(kk == VqSideKind::vq || kk == VqSideKind::fp16, "ref vq plan: the key side is not in the vq pages");
  check(kk != VqSideKind::vq || d % 2 == 0, "ref vq plan: head_dim {} is odd (vq keys get RoPE)", d);
  const bool scalar_v = vk == VqSideKind::none;
  check(!scalar_v || scalar_values != nullptr,
        "ref vq plan: the value side is not in the vq pages: pass its scalar TQ-MSE PackedPlan");
  check(scalar_v || scalar_values == nullptr,
        "ref vq plan: a scalar value plan was given but the value side is in the vq pages");
  if (scalar_v) {
    const packed::LayerLayout& S = scalar_values->layout();
    check(S.head_dim() == d && S.n_kv_heads() == hkv && scalar_values->n_heads() == n_heads,
          "ref vq plan: scalar value plan (head_dim {}, {} KV heads, {} query heads) does not match (head_dim {}, {} "
          "KV heads, {} query heads)",
          S.head_dim(), S.n_kv_heads(), scalar_values->n_heads(), d, hkv, n_heads);
    check(!scalar_values->has_wide(), "ref vq plan: scalar value plans with 5..8-bit groups are not served with vq keys");
    for (int h = 0; h < hkv; ++h)
      check(S.head(h).key.empty(), "ref vq plan: the scalar value plan has key groups (KV head {})", h);
  }
  cw_off_.assign(static_cast<size_t>(hkv) * 2, 0);
  ch_off_.assign(static_cast<size_t>(hkv) * 2, 0);
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s) {
      const packed::VqSideSpec& sp = layout.side(s == 0 ? Side::key : Side::value);
      if (sp.kind != VqSideKind::vq) continue;
      check(d % sp.n_groups == 0, "ref vq plan: {} groups do not divide head_dim {}", sp.n_groups, d);
      const int G = sp.n_groups, g = d / G;
      const size_t ncw = static_cast<size_t>(G) * (size_t{1} << sp.bits) * g, nch = static_cast<size_t>(d);
      check(cw_.size() + ncw <= codewords.size(),
            "ref vq plan: codewords has {} floats, the layout needs more (KV head {} {})", codewords.size(), h,
            side_name(s));
      check(ch_.size() + nch <= channels.size(), "ref vq plan: channels has {} ints, the layout needs more (KV head {} {})",
            channels.size(), h, side_name(s));
      cw_off_[static_cast<size_t>(h) * 2 + s] = cw_.size();
      for (size_t i = 0; i < ncw; ++i) {
        const float x = codewords[cw_.size()];
        check(std::isfinite(x), "ref vq plan: codeword value {} of KV head {} {} is not finite", i, h, side_name(s));
        cw_.push_back(x);
      }
      ch_off_[static_cast<size_t>(h) * 2 + s] = ch_.size();
      std::vector<int> seen(d, 0);
      for (size_t i = 0; i < nch; ++i) {
        const int32_t c = channels[ch_.size()];
        check(c >= 0 && c < d && !seen[c]++,
              "ref vq plan: channel lists of KV head {} {} are not a permutation of 0..{} (entry {} = {})", h,
              side_name(s), d - 1, i, c);
        ch_.push_back(c);
      }
    }
  check(cw_.size() == codewords.size(), "ref vq plan: codewords has {} floats, the layout uses {}", codewords.size(),
        cw_.size());
  check(ch_.size() == channels.size(), "ref vq plan: channels has {} ints, the layout uses {}", channels.size(),
        ch_.size());
}

std::span<const float> VqPlan::codewords(int h, Side s) const {
  const packed::VqSideSpec& sp = layout_.side(s);
  check(sp.kind == VqSideKind::vq && h >= 0 && h < n_kv_heads(), "ref vq plan: no codewords for KV head {} {}", h,
        side_name(static_cast<int>(s)));
  return std::span<const float>(cw_).subspan(cw_off_[static_cast<size_t>(h) * 2 + static_cast<int>(s)],
                                             static_cast<size_t>(head_dim()) << sp.bits);
}

std::span<const int32_t> VqPlan::channels(int h, Side s) const {
  const packed::VqSideSpec& sp = layout_.side(s);
  check(sp.kind == VqSideKind::vq && h >= 0 && h < n_kv_heads(), "ref vq plan: no channel lists for KV head {} {}", h,
        side_name(static_cast<int>(s)));
  return std::span<const int32_t>(ch_).subspan(ch_off_[static_cast<size_t>(h) * 2 + static_cast<int>(s)],
                                               static_cast<size_t>(head_dim()));
}

}  // namespace ratekv::ref
