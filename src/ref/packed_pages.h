// Internal to src/ref: reading one token's codes and norm of one group from
// a pool of packed pages (docs/packed_format.md §2–§5) through the format's
// reference reader, with the high bits of a 5..8-bit group from the
// extension pool.
#pragma once

#include <cstdint>
#include <span>

#include "ratekv/common/fp16.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/ref/packed_plan.h"

namespace ratekv::ref::detail {

/// Physical page p of a pool of `page_bytes`-byte pages.
inline std::span<const uint8_t> pool_page(std::span<const uint8_t> pool, size_t page_bytes, int32_t p) {
  return pool.subspan(static_cast<size_t>(p) * page_bytes, page_bytes);
}

/// The dim codes of group g of side s of KV head h in token slot `slot` of
/// physical page p; a 5..8-bit group's code is low | high << 4. `hi` is
/// scratch of ≥ dim bytes.
inline void read_group_codes(const PackedPlan& plan, std::span<const uint8_t> pool,
                             std::span<const uint8_t> ext_pool, int32_t p, int h, packed::Side s, int g,
                             int slot, std::span<uint8_t> codes, std::span<uint8_t> hi) {
  const packed::LayerLayout& L = plan.layout();
  const int dim = L.head(h).side(s)[g].dim;
  packed::read_codes(L, pool_page(pool, L.page_bytes(), p), h, s, g, slot, codes.first(dim));
  const int e = plan.ext_group(h, s, g);
  if (e < 0) return;
  const packed::LayerLayout& X = *plan.ext_layout();
  packed::read_codes(X, pool_page(ext_pool, X.page_bytes(), p), h, s, e, slot, hi.first(dim));
  for (int j = 0; j < dim; ++j) codes[j] = static_cast<uint8_t>(codes[j] | hi[j] << 4);
}

/// The stored norm (fp16 → fp32) of group g of side s of KV head h in slot
/// `slot` of physical page p.
inline float read_group_norm(const packed::LayerLayout& L, std::span<const uint8_t> pool, int32_t p, int h,
                             packed::Side s, int g, int slot) {
  return fp16_to_fp32(packed::read_norm(L, pool_page(pool, L.page_bytes(), p), h, s, g, slot));
}

/// Pages in a pool of `bytes` bytes; Error (naming `what` and `field`) when
/// the bytes are not whole pages.
size_t pool_pages(size_t bytes, size_t page_bytes, const char* what, const char* field);

}  // namespace ratekv::ref::detail
