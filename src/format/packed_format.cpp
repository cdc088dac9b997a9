// Packed KV-cache format: layout arithmetic and the scalar reference
// writer/reader (docs/packed_format.md). Bit by bit on purpose: this code
// defines the format; fast paths (CUDA append/attention) are tested against it.
#include "ratekv/format/packed_format.h"

#include <algorithm>

#include "ratekv/common/error.h"

namespace ratekv::packed {

namespace {

void validate_side(const std::vector<GroupSpec>& groups, int head_dim, int h, const char* side) {
  // No groups is allowed: a side whose every channel is at 0 bits stores
  // nothing (its keys score 0, its values contribute 0; docs/packed_format.md §5).
  check((int)groups.size() <= kMaxGroupsPerSide,
        "packed layout: KV head {} has {} {} groups (at most {} supported)", h, groups.size(), side,
        kMaxGroupsPerSide);
  std::vector<char> seen((size_t)head_dim, 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupSpec& G = groups[g];
    check(G.bits >= kMinBits && G.bits <= kMaxBits,
          "packed layout: KV head {} {} group {}: bits {} out of range (expected {}..{})", h, side,
          g, G.bits, kMinBits, kMaxBits);
    check(!G.channels.empty(), "packed layout: KV head {} {} group {} has no channels", h, side, g);
    for (int c : G.channels) {
      check(c >= 0 && c < head_dim,
            "packed layout: KV head {} {} group {}: channel {} outside [0, head_dim={})", h, side,
            g, c, head_dim);
      check(!seen[(size_t)c], "packed layout: KV head {} {}: channel {} appears in two groups", h,
            side, c);
      seen[(size_t)c] = 1;
    }
  }
}

const GroupLayout& group_at(const LayerLayout& L, int h, Side side, int g) {
  check(h >= 0 && h < L.n_kv_heads(), "packed format: KV head {} outside [0, {})", h,
        L.n_kv_heads());
  const auto& groups = L.head(h).side(side);
  check(g >= 0 && g < (int)groups.size(), "packed format: group {} outside [0, {})", g,
        groups.size());
  return groups[(size_t)g];
}

size_t head_base(const LayerLayout& L, size_t page_size, int h, int slot) {
  check(page_size == L.page_bytes(), "packed format: page span has {} bytes, layout expects {}",
        page_size, L.page_bytes());
  check(slot >= 0 && slot < kPageTokens, "packed format: token slot {} outside [0, {})", slot,
        kPageTokens);
  return L.head(h).block_offset;
}

// Byte offset (within the group's code segment) and bit of code bit j of
// element (slot, c): lane-word row (ct·b + word), word of the owning lane.
struct BitAddr {
  size_t byte;
  int bit;
};
BitAddr bit_addr(const GroupLayout& G, Side side, int slot, int c, int j) {
  const int tt = slot / kTileTokens, r = slot % kTileTokens;
  const int ct = c / kTileChannels, cc = c % kTileChannels;
  const ElementPos e = element_pos(side, r, cc);
  const CodeBitPos p = code_bit_pos(G.bits, tt, e.elem, j);
  const size_t row = (size_t)ct * (size_t)G.bits + (size_t)p.word;
  return {row * kLaneRowBytes + 4 * (size_t)e.lane + (size_t)(p.bit / 8), p.bit % 8};
}

}  // namespace

LayerLayout::LayerLayout(int head_dim, std::vector<HeadSpec> heads)
    : head_dim_(head_dim), specs_(std::move(heads)) {
  check(head_dim > 0 && head_dim % 2 == 0, "packed layout: head_dim {} must be positive and even",
        head_dim);
  check(!specs_.empty(), "packed layout: no KV heads");
  size_t page = 0;
  for (size_t h = 0; h < specs_.size(); ++h) {
    validate_side(specs_[h].key, head_dim, (int)h, "key");
    validate_side(specs_[h].value, head_dim, (int)h, "value");
    HeadLayout H;
    H.block_offset = page;
    size_t off = 0;
    auto add_codes = [&](const std::vector<GroupSpec>& gs, std::vector<GroupLayout>& out) {
      for (const GroupSpec& G : gs) {
        GroupLayout gl;
        gl.dim = (int)G.channels.size();
        gl.dim_pad = (gl.dim + kTileChannels - 1) / kTileChannels * kTileChannels;
        gl.bits = G.bits;
        gl.code_offset = off;
        gl.code_bytes = (size_t)kPageTokens * (size_t)gl.dim_pad * (size_t)gl.bits / 8;
        off += gl.code_bytes;
        out.push_back(gl);
      }
    };
    add_codes(specs_[h].key, H.key);
    add_codes(specs_[h].value, H.value);
    for (GroupLayout& gl : H.key) {
      gl.norm_offset = off;
      off += sizeof(PageNorms);
    }
    for (GroupLayout& gl : H.value) {
      gl.norm_offset = off;
      off += sizeof(PageNorms);
    }
    H.block_bytes = off;  // multiple of 128: code segments are 8·dim_pad·bits, norms 128
    page += off;
    heads_.push_back(std::move(H));
  }
  page_bytes_ = page;
}

LayerLayout LayerLayout::uniform(int head_dim, int n_kv_heads, int key_bits, int value_bits) {
  check(n_kv_heads > 0, "packed layout: n_kv_heads {} must be positive", n_kv_heads);
  GroupSpec all;
  for (int c = 0; c < head_dim; ++c) all.channels.push_back(c);
  std::vector<HeadSpec> heads((size_t)n_kv_heads);
  for (HeadSpec& h : heads) {
    h.key = {GroupSpec{all.channels, key_bits}};
    h.value = {GroupSpec{all.channels, value_bits}};
  }
  return LayerLayout(head_dim, std::move(heads));
}

double LayerLayout::bytes_per_token_per_head() const {
  return (double)page_bytes_ / (double)kPageTokens / (double)heads_.size();
}

void write_codes(const LayerLayout& L, std::span<uint8_t> page, int h, Side side, int g, int slot,
                 std::span<const uint8_t> codes) {
  const GroupLayout& G = group_at(L, h, side, g);
  const size_t base = head_base(L, page.size(), h, slot) + G.code_offset;
  check((int)codes.size() == G.dim, "packed format: {} codes given, group has dim {}",
        codes.size(), G.dim);
  for (int c = 0; c < G.dim_pad; ++c) {
    const unsigned code = c < G.dim ? codes[(size_t)c] : 0u;
    check(code < (1u << G.bits), "packed format: code {} at coordinate {} does not fit in {} bits",
          code, c, G.bits);
    for (int j = 0; j < G.bits; ++j) {
      const BitAddr a = bit_addr(G, side, slot, c, j);
      uint8_t& byte = page[base + a.byte];
      byte = (uint8_t)((byte & ~(1u << a.bit)) | (((code >> j) & 1u) << a.bit));
    }
  }
}

void read_codes(const LayerLayout& L, std::span<const uint8_t> page, int h, Side side, int g,
                int slot, std::span<uint8_t> codes) {
  const GroupLayout& G = group_at(L, h, side, g);
  const size_t base = head_base(L, page.size(), h, slot) + G.code_offset;
  check((int)codes.size() == G.dim, "packed format: room for {} codes, group has dim {}",
        codes.size(), G.dim);
  for (int c = 0; c < G.dim; ++c) {
    unsigned code = 0;
    for (int j = 0; j < G.bits; ++j) {
      const BitAddr a = bit_addr(G, side, slot, c, j);
      code |= ((page[base + a.byte] >> a.bit) & 1u) << j;
    }
    codes[(size_t)c] = (uint8_t)code;
  }
}

void write_norm(const LayerLayout& L, std::span<uint8_t> page, int h, Side side, int g, int slot,
                uint16_t norm_fp16) {
  const GroupLayout& G = group_at(L, h, side, g);
  const size_t at = head_base(L, page.size(), h, slot) + G.norm_offset + 2 * (size_t)slot;
  page[at] = (uint8_t)(norm_fp16 & 0xff);  // little endian, as the GPU reads it
  page[at + 1] = (uint8_t)(norm_fp16 >> 8);
}

uint16_t read_norm(const LayerLayout& L, std::span<const uint8_t> page, int h, Side side, int g,
                   int slot) {
  const GroupLayout& G = group_at(L, h, side, g);
  const size_t at = head_base(L, page.size(), h, slot) + G.norm_offset + 2 * (size_t)slot;
  return (uint16_t)(page[at] | (page[at + 1] << 8));
}

std::span<uint8_t> HostPagePool::page(int p) {
  check(layout && p >= 0 && p < n_pages(), "packed pool: page {} outside [0, {})", p, n_pages());
  return std::span<uint8_t>(bytes).subspan((size_t)p * layout->page_bytes(), layout->page_bytes());
}
std::span<const uint8_t> HostPagePool::page(int p) const {
  check(layout && p >= 0 && p < n_pages(), "packed pool: page {} outside [0, {})", p, n_pages());
  return std::span<const uint8_t>(bytes).subspan((size_t)p * layout->page_bytes(),
                                                  layout->page_bytes());
}

}  // namespace ratekv::packed
