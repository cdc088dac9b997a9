// The packed cache's format fast paths (include/ratekv/cache/packed_kv_cache.h):
// one token's codes packed into a group's lane words, and a page's codes
// unpacked, both tested byte-exact against the format's reference
// writer / reader (format/packed_format.h).
#include <cstring>

#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"

namespace ratekv::cache {

using packed::kTileChannels;
using packed::kTileTokens;

namespace {

// (token r, channel c) of every (lane, bit) of a chunk, per side.
struct InverseTable {
  uint8_t r[2][packed::kWarpLanes][8];
  uint8_t c[2][packed::kWarpLanes][8];
  InverseTable() {
    for (int s = 0; s < 2; ++s)
      for (int r0 = 0; r0 < kTileTokens; ++r0)
        for (int c0 = 0; c0 < kTileChannels; ++c0) {
          const packed::ElementPos e = packed::element_pos(static_cast<packed::Side>(s), r0, c0);
          r[s][e.lane][e.elem] = static_cast<uint8_t>(r0);
          c[s][e.lane][e.elem] = static_cast<uint8_t>(c0);
        }
  }
};
const InverseTable& inverse_table() {
  static const InverseTable t;
  return t;
}

}  // namespace

// ---- format fast paths ---------------------------------------------------------

// One read-modify-write of one lane word per code (two more for the 3-bit
// tile-3 bits): the code's bits sit in nibble e of word code_bit_pos(b, tt, e,
// 0).word, contiguous from bit code_bit_pos(b, tt, e, 0).bit, except 3 bits in
// token tile 3 (bit 3 of nibble e of words 0, 1, 2). Same bytes as the
// reference write_codes (test FastPackUnpackMatchReference).
void pack_token_codes(const packed::GroupLayout& G, packed::Side side, uint8_t* seg, int slot,
                      const uint8_t* codes) {
  const int tt = slot / kTileTokens, r = slot % kTileTokens, b = G.bits;
  const uint32_t low = (1u << b) - 1u;
  auto rmw = [&](size_t byte, uint32_t mask, uint32_t bits) {
    uint32_t w;
    std::memcpy(&w, seg + byte, 4);
    w = (w & ~mask) | bits;
    std::memcpy(seg + byte, &w, 4);
  };
  for (int c = 0; c < G.dim_pad; ++c) {
    const uint32_t code = c < G.dim ? codes[c] : 0u;
    const int ct = c / kTileChannels;
    const packed::ElementPos e = packed::element_pos(side, r, c % kTileChannels);
    const size_t row0 = static_cast<size_t>(ct) * b;  // first lane-word row of this channel tile
    if (b != 3 || tt < 3) {
      const packed::CodeBitPos p = packed::code_bit_pos(b, tt, e.elem, 0);
      rmw((row0 + p.word) * packed::kLaneRowBytes + 4 * e.lane, low << p.bit, code << p.bit);
    } else {
      for (int i = 0; i < 3; ++i) {
        const packed::CodeBitPos p = packed::code_bit_pos(b, tt, e.elem, i);
        rmw((row0 + p.word) * packed::kLaneRowBytes + 4 * e.lane, 1u << p.bit, ((code >> i) & 1u) << p.bit);
      }
    }
  }
}

namespace {

// The b-bit code of fragment element e of token tile tt from a lane's b words.
// Wherever the format keeps a code's bits contiguous in one word (every case
// but 3-bit token tile 3) one shift and mask; else bit by bit.
template <int B>
inline unsigned extract_code(const uint32_t* w, int tt, int e) {
  const packed::CodeBitPos p0 = packed::code_bit_pos(B, tt, e, 0);
  if (B != 3 || tt < 3) return (w[p0.word] >> p0.bit) & ((1u << B) - 1u);
  unsigned code = 0;
  for (int i = 0; i < B; ++i) {
    const packed::CodeBitPos p = packed::code_bit_pos(B, tt, e, i);
    code |= ((w[p.word] >> p.bit) & 1u) << i;
  }
  return code;
}

template <int B>
void unpack_codes_b(const packed::GroupLayout& G, int s, const uint8_t* seg, int n_tt, uint8_t* codes) {
  const InverseTable& inv = inverse_table();
  const int n_ct = G.dim_pad / kTileChannels;
  for (int ct = 0; ct < n_ct; ++ct)
    for (int lane = 0; lane < packed::kWarpLanes; ++lane) {
      uint32_t w[B];
      for (int j = 0; j < B; ++j)
        std::memcpy(&w[j], seg + (static_cast<size_t>(ct) * B + j) * packed::kLaneRowBytes + 4 * lane, 4);
      for (int tt = 0; tt < n_tt; ++tt) {
        uint8_t* tile = codes + static_cast<size_t>(tt) * kTileTokens * G.dim_pad + ct * kTileChannels;
        for (int e = 0; e < 8; ++e)
          tile[inv.r[s][lane][e] * G.dim_pad + inv.c[s][lane][e]] = static_cast<uint8_t>(extract_code<B>(w, tt, e));
      }
    }
}

}  // namespace

void unpack_codes(const packed::GroupLayout& G, packed::Side side, const uint8_t* seg, int n_slots,
                  uint8_t* codes) {
  const int s = static_cast<int>(side);
  const int n_tt = (n_slots + kTileTokens - 1) / kTileTokens;
  switch (G.bits) {
    case 1: return unpack_codes_b<1>(G, s, seg, n_tt, codes);
    case 2: return unpack_codes_b<2>(G, s, seg, n_tt, codes);
    case 3: return unpack_codes_b<3>(G, s, seg, n_tt, codes);
    case 4: return unpack_codes_b<4>(G, s, seg, n_tt, codes);
    default: fail("unpack_codes: {} bits outside 1..4", G.bits);
  }
}

}  // namespace ratekv::cache
