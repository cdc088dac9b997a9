// The vq pages of the packed format: layout arithmetic, the scalar reference
// writer/reader (include/ratekv/format/packed_vq_format.h,
// docs/packed_format.md §7). Bit by bit on purpose: this code defines the
// format; fast paths are tested against it.
#include "ratekv/format/packed_vq_format.h"

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::packed {

namespace {

size_t align16(size_t n) { return (n + kVqAlign - 1) / kVqAlign * kVqAlign; }

const char* side_name(Side s) { return s == Side::key ? "key" : "value"; }

void validate_spec(const VqSideSpec& sp, const char* side) {
  if (sp.kind == VqSideKind::vq) {
    check(sp.n_groups >= 1, "packed vq layout: {} side: {} groups (expected ≥ 1)", side, sp.n_groups);
    check(sp.bits >= 1 && sp.bits <= kVqMaxBits, "packed vq layout: {} side: index width {} outside 1..{}", side,
          sp.bits, kVqMaxBits);
  } else {
    check(sp.n_groups == 0 && sp.bits == 0 && !sp.shared_scale,
          "packed vq layout: {} side is not vq but has vq fields (groups {}, bits {}, shared scale {})", side,
          sp.n_groups, sp.bits, sp.shared_scale);
  }
}

void check_page(const VqLayerLayout& L, size_t page_size, int slot) {
  check(page_size == L.page_bytes(), "packed vq format: page span has {} bytes, layout expects {}", page_size,
        L.page_bytes());
  check(slot >= 0 && slot < kPageTokens, "packed vq format: token slot {} outside [0, {})", slot, kPageTokens);
}

void check_kind(const VqLayerLayout& L, Side s, VqSideKind want, const char* what) {
  check(L.side(s).kind == want, "packed vq format: {} side is not {}", side_name(s), what);
}

}  // namespace

VqLayerLayout::VqLayerLayout(int head_dim, int n_kv_heads, VqSideSpec key, VqSideSpec value)
    : head_dim_(head_dim), n_kv_heads_(n_kv_heads), key_(key), value_(value) {
  check(head_dim > 0 && n_kv_heads > 0, "packed vq layout: head_dim {} and n_kv_heads {} must be positive",
        head_dim, n_kv_heads);
  validate_spec(key_, "key");
  validate_spec(value_, "value");
  for (int s = 0; s < 2; ++s) {
    const VqSideSpec& sp = s == 0 ? key_ : value_;
    if (sp.kind == VqSideKind::vq)
      seg_bytes_[s] = align16(static_cast<size_t>(kPageTokens) * sp.n_groups * sp.bits / 8);
    else if (sp.kind == VqSideKind::fp16)
      seg_bytes_[s] = static_cast<size_t>(kPageTokens) * head_dim * 2;
  }
  head_bytes_ = seg_bytes_[0] + seg_bytes_[1];
  size_t off = head_bytes_ * n_kv_heads;
  for (int s = 0; s < 2; ++s) {
    const VqSideSpec& sp = s == 0 ? key_ : value_;
    if (sp.kind == VqSideKind::vq && sp.shared_scale) {
      scale_off_[s] = off;
      off += sizeof(PageNorms);
    }
  }
  page_bytes_ = off;
}

size_t VqLayerLayout::segment_offset(int h, Side s) const {
  check(h >= 0 && h < n_kv_heads_, "packed vq format: KV head {} outside [0, {})", h, n_kv_heads_);
  return head_bytes_ * h + (s == Side::key ? 0 : seg_bytes_[0]);
}

size_t VqLayerLayout::scale_offset(Side s) const {
  const VqSideSpec& sp = side(s);
  check(sp.kind == VqSideKind::vq && sp.shared_scale, "packed vq format: {} side has no shared scale",
        side_name(s));
  return scale_off_[static_cast<int>(s)];
}

double VqLayerLayout::bytes_per_token() const {
  double b = 0;
  for (Side s : {Side::key, Side::value}) {
    const VqSideSpec& sp = side(s);
    if (sp.kind == VqSideKind::vq) b += n_kv_heads_ * sp.n_groups * sp.bits / 8.0 + (sp.shared_scale ? 2.0 : 0.0);
    if (sp.kind == VqSideKind::fp16) b += n_kv_heads_ * 2.0 * head_dim_;
  }
  return b;
}

void write_vq_indices(const VqLayerLayout& L, std::span<uint8_t> page, int h, Side s, int slot,
                      std::span<const int32_t> idx) {
  check_page(L, page.size(), slot);
  check_kind(L, s, VqSideKind::vq, "vq");
  const VqSideSpec& sp = L.side(s);
  check(static_cast<int>(idx.size()) == sp.n_groups, "packed vq format: {} indices given, side has {} groups",
        idx.size(), sp.n_groups);
  uint8_t* seg = page.data() + L.segment_offset(h, s);
  for (int gi = 0; gi < sp.n_groups; ++gi) {
    const int32_t z = idx[gi];
    check(z >= 0 && z < (int32_t{1} << sp.bits), "packed vq format: index {} of group {} does not fit in {} bits", z,
          gi, sp.bits);
    const size_t p0 = (static_cast<size_t>(slot) * sp.n_groups + gi) * sp.bits;
    for (int j = 0; j < sp.bits; ++j) {
      const size_t p = p0 + j;
      uint8_t& byte = seg[p / 8];
      byte = static_cast<uint8_t>((byte & ~(1u << (p % 8))) | (((static_cast<uint32_t>(z) >> j) & 1u) << (p % 8)));
    }
  }
}

void read_vq_indices(const VqLayerLayout& L, std::span<const uint8_t> page, int h, Side s, int slot,
                     std::span<int32_t> idx) {
  check_page(L, page.size(), slot);
  check_kind(L, s, VqSideKind::vq, "vq");
  const VqSideSpec& sp = L.side(s);
  check(static_cast<int>(idx.size()) == sp.n_groups, "packed vq format: room for {} indices, side has {} groups",
        idx.size(), sp.n_groups);
  const uint8_t* seg = page.data() + L.segment_offset(h, s);
  for (int gi = 0; gi < sp.n_groups; ++gi) {
    const size_t p0 = (static_cast<size_t>(slot) * sp.n_groups + gi) * sp.bits;
    uint32_t z = 0;
    for (int j = 0; j < sp.bits; ++j) {
      const size_t p = p0 + j;
      z |= ((seg[p / 8] >> (p % 8)) & 1u) << j;
    }
    idx[gi] = static_cast<int32_t>(z);
  }
}

void write_vq_scale(const VqLayerLayout& L, std::span<uint8_t> page, Side s, int slot, uint16_t scale_fp16) {
  check_page(L, page.size(), slot);
  const size_t at = L.scale_offset(s) + 2 * static_cast<size_t>(slot);
  page[at] = static_cast<uint8_t>(scale_fp16 & 0xff);  // little endian
  page[at + 1] = static_cast<uint8_t>(scale_fp16 >> 8);
}

uint16_t read_vq_scale(const VqLayerLayout& L, std::span<const uint8_t> page, Side s, int slot) {
  check_page(L, page.size(), slot);
  const size_t at = L.scale_offset(s) + 2 * static_cast<size_t>(slot);
  return static_cast<uint16_t>(page[at] | (page[at + 1] << 8));
}

void write_fp16_row(const VqLayerLayout& L, std::span<uint8_t> page, int h, Side s, int slot,
                    std::span<const uint16_t> row) {
  check_page(L, page.size(), slot);
  check_kind(L, s, VqSideKind::fp16, "fp16");
  check(static_cast<int>(row.size()) == L.head_dim(), "packed vq format: fp16 row of {} values, head_dim {}",
        row.size(), L.head_dim());
  uint8_t* at = page.data() + L.segment_offset(h, s) + 2 * static_cast<size_t>(slot) * L.head_dim();
  for (int c = 0; c < L.head_dim(); ++c) {
    at[2 * c] = static_cast<uint8_t>(row[c] & 0xff);
    at[2 * c + 1] = static_cast<uint8_t>(row[c] >> 8);
  }
}

void read_fp16_row(const VqLayerLayout& L, std::span<const uint8_t> page, int h, Side s, int slot,
                   std::span<uint16_t> row) {
  check_page(L, page.size(), slot);
  check_kind(L, s, VqSideKind::fp16, "fp16");
  check(static_cast<int>(row.size()) == L.head_dim(), "packed vq format: room for {} values, head_dim {}",
        row.size(), L.head_dim());
  const uint8_t* at = page.data() + L.segment_offset(h, s) + 2 * static_cast<size_t>(slot) * L.head_dim();
  for (int c = 0; c < L.head_dim(); ++c) row[c] = static_cast<uint16_t>(at[2 * c] | (at[2 * c + 1] << 8));
}

}  // namespace ratekv::packed
