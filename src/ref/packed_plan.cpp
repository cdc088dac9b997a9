// ref::PackedPlan (include/ratekv/ref/packed_plan.h).
#include "ratekv/ref/packed_plan.h"

#include <cmath>

#include "ratekv/common/error.h"

namespace ratekv::ref {

using packed::Side;

namespace {
const char* side_name(int s) { return s == 0 ? "key" : "value"; }
}  // namespace

PackedPlan::PackedPlan(const packed::LayerLayout& layout, int n_heads, std::span<const float> rotations,
                       std::span<const float> levels)
    : layout_(layout), n_heads_(n_heads) {
  build(rotations, levels);
}

PackedPlan::PackedPlan(const packed::LayerLayout& layout, const packed::LayerLayout& ext, int n_heads,
                       std::span<const float> rotations, std::span<const float> levels)
    : layout_(layout), ext_(ext), n_heads_(n_heads) {
  build(rotations, levels);
}

void PackedPlan::build(std::span<const float> rotations, std::span<const float> levels) {
  const int hkv = layout_.n_kv_heads(), d = layout_.head_dim();
  check(n_heads_ > 0 && n_heads_ % hkv == 0, "ref packed plan: n_heads {} is not a positive multiple of n_kv_heads {}",
        n_heads_, hkv);
  if (ext_)
    check(ext_->head_dim() == d && ext_->n_kv_heads() == hkv,
          "ref packed plan: extension layout (head_dim {}, {} KV heads) does not match the layout (head_dim {}, {} "
          "KV heads)",
          ext_->head_dim(), ext_->n_kv_heads(), d, hkv);
  entries_.assign(static_cast<size_t>(hkv) * 2, {});
  size_t rot_used = 0, lvl_used = 0;
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s) {
      const auto& specs = s == 0 ? layout_.spec(h).key : layout_.spec(h).value;
      std::vector<Entry>& E = entries_[static_cast<size_t>(h) * 2 + s];
      E.resize(specs.size());
      for (size_t g = 0; g < specs.size(); ++g) E[g].bits = specs[g].bits;
      if (ext_) {  // wide groups: extension group e ↔ first untaken 4-bit group with its channels
        const auto& especs = s == 0 ? ext_->spec(h).key : ext_->spec(h).value;
        for (size_t e = 0; e < especs.size(); ++e) {
          size_t g = 0;
          while (g < specs.size() && (E[g].ext_group >= 0 || specs[g].bits != packed::kMaxBits ||
                                      specs[g].channels != especs[e].channels))
            ++g;
          check(g < specs.size(),
                "ref packed plan: extension group {} of KV head {} {} has no 4-bit group with the same channels in "
                "the layout",
                e, h, side_name(s));
          check(especs[e].bits <= 8 - packed::kMaxBits,
                "ref packed plan: extension group {} of KV head {} {} has {} bits (at most {})", e, h, side_name(s),
                especs[e].bits, 8 - packed::kMaxBits);
          E[g].ext_group = static_cast<int>(e);
          E[g].bits = packed::kMaxBits + especs[e].bits;
          has_wide_ = true;
        }
      }
      for (size_t g = 0; g < specs.size(); ++g) {
        const size_t m = specs[g].channels.size(), rn = m * m, ln = size_t{1} << E[g].bits;
        check(rot_used + rn <= rotations.size(),
              "ref packed plan: rotations has {} floats, the layout needs more (KV head {} {} group {})",
              rotations.size(), h, side_name(s), g);
        check(lvl_used + ln <= levels.size(),
              "ref packed plan: levels has {} floats, the layout needs more (KV head {} {} group {})", levels.size(),
              h, side_name(s), g);
        for (size_t i = 0; i < rn; ++i)
          check(std::isfinite(rotations[rot_used + i]),
                "ref packed plan: rotation of KV head {} {} group {} has a non-finite entry", h, side_name(s), g);
        for (size_t i = 0; i < ln; ++i) {
          const float v = levels[lvl_used + i];
          check(std::isfinite(v) && (i == 0 || v > levels[lvl_used + i - 1]),
                "ref packed plan: levels of KV head {} {} group {} are not finite and strictly ascending", h,
                side_name(s), g);
        }
        E[g].rot = rot_used;
        E[g].lvl = lvl_used;
        rot_used += rn;
        lvl_used += ln;
      }
    }
  check(rot_used == rotations.size(), "ref packed plan: rotations has {} floats, the layout uses {}",
        rotations.size(), rot_used);
  check(lvl_used == levels.size(), "ref packed plan: levels has {} floats, the layout uses {}", levels.size(),
        lvl_used);
  rot_.assign(rotations.begin(), rotations.end());
  lvl_.assign(levels.begin(), levels.end());
}

const PackedPlan::Entry& PackedPlan::at(int h, Side s, int g) const {
  check(h >= 0 && h < layout_.n_kv_heads(), "ref packed plan: KV head {} outside [0, {})", h, layout_.n_kv_heads());
  const auto& E = entries_[static_cast<size_t>(h) * 2 + static_cast<int>(s)];
  check(g >= 0 && static_cast<size_t>(g) < E.size(), "ref packed plan: group {} outside [0, {}) (KV head {} {})", g,
        E.size(), h, side_name(static_cast<int>(s)));
  return E[g];
}

std::span<const float> PackedPlan::rotation(int h, Side s, int g) const {
  const Entry& e = at(h, s, g);
  const size_t m = layout_.head(h).side(s)[g].dim;
  return std::span<const float>(rot_).subspan(e.rot, m * m);
}

std::span<const float> PackedPlan::levels(int h, Side s, int g) const {
  const Entry& e = at(h, s, g);
  return std::span<const float>(lvl_).subspan(e.lvl, size_t{1} << e.bits);
}

}  // namespace ratekv::ref
