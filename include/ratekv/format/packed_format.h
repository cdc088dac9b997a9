// ratekv/format/packed_format.h — the packed KV-cache format (GPU-first), its layout
// arithmetic and the scalar reference writer/reader that DEFINE it.
//
// Specification: docs/packed_format.md. Summary:
//  * A layer's cache is a pool of pages; a page holds kPageTokens (64) token
//    slots for every KV head of the layer. A per-sequence page table maps
//    logical page i (tokens [64i, 64i+64)) to a physical page.
//  * Per (page, KV head) one contiguous head block:
//      [K group 0 codes][K group 1 codes]...[V group 0 codes]...
//      [K norms: n_k_groups × 64 fp16][V norms: n_v_groups × 64 fp16]
//  * A group (channels sharing one bit width b ∈ 1..4, one TurboQuant-MSE
//    encoder of dimension m = |channels|, docs/design.md §2) is padded to
//    m_pad = 16·⌈m/16⌉ rotated coordinates and cut into 16-channel tiles ct;
//    a page's 64 tokens are 4 token tiles tt of 16. In every 16×16 tile
//    (tt, ct), lane L of a warp owns the 8 elements it holds in the
//    mma.m16n8k16 B fragment (keys: k = channel, n = token; values: k = token,
//    n = channel). Per channel tile the codes of all 4 token tiles are b
//    "lane-word rows" of 32 little-endian uint32 (word w of lane L at byte
//    4·(32·(ct·b + w) + L)); inside them the b-bit code of element e of token
//    tile tt sits in nibble e (code_bit_pos()), so one AND gives a byte-permute
//    selector. A b-bit code takes exactly b bits.
//  * Codes are indices into the group's Lloyd–Max codebook (2^b levels,
//    ascending); the stored norm is fp16(‖x_g‖); x̂_g = n · Π_gᵀ c[idx] in the
//    group's rotated domain (keys and values alike). Codebooks and rotations
//    live outside the pages (shared per plan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ratekv::packed {

inline constexpr int kPageTokens = 64;     ///< token slots per page
inline constexpr int kTileTokens = 16;     ///< tokens per tile (mma k/n extent)
inline constexpr int kTileChannels = 16;   ///< rotated channels per tile
inline constexpr int kWarpLanes = 32;
inline constexpr int kLaneRowBytes = 4 * kWarpLanes;  ///< one uint32 per lane
inline constexpr int kMinBits = 1;
inline constexpr int kMaxBits = 4;         ///< Lloyd–Max codebooks of ≤ 16 levels
inline constexpr int kMaxGroupsPerSide = 8;
inline constexpr int kTilesPerPage = kPageTokens / kTileTokens;

/// One lane-word row: word L belongs to lane L. A channel tile of a b-bit group
/// is b rows per page (32 lanes × 4 token tiles × 8 elements × b bits).
struct LaneRow {
  uint32_t lane_word[kWarpLanes];
};
static_assert(sizeof(LaneRow) == kLaneRowBytes, "a row is one word per lane");
static_assert(kLaneRowBytes * 8 == kTilesPerPage * kTileTokens * kTileChannels,
              "one row holds one bit of every element of a 64-token channel tile");

/// The per-page norm array of one group: fp16 bits, slot t = token t of page.
struct PageNorms {
  uint16_t fp16[kPageTokens];
};
static_assert(sizeof(PageNorms) == 2 * kPageTokens, "fp16 per token slot");
static_assert(sizeof(PageNorms) % 16 == 0, "norm arrays keep 16-byte alignment");

enum class Side : uint8_t { key = 0, value = 1 };

/// Which lane owns one element (token r, rotated channel c) of a 16×16 tile
/// and its fragment element index e (0..7):
///   keys   (B = Kᵀ, k = channel, n = token):
///     lane = 4·(r mod 8) + (c mod 8)/2,  e = 4·(r/8) + 2·(c/8) + c mod 2
///   values (B = V,  k = token,  n = channel): same with r and c swapped.
/// e = 4h + 2j + p addresses fragment register h (n-half), element pair j.
struct ElementPos {
  int lane;
  int elem;
};
constexpr ElementPos element_pos(Side side, int r, int c) {
  if (side == Side::value) {
    const int t = r;
    r = c;
    c = t;
  }
  return {4 * (r % 8) + (c % 8) / 2, 4 * (r / 8) + 2 * (c / 8) + c % 2};
}

/// Where bit i (0..bits−1) of the code of fragment element e (0..7) of token
/// tile tt (0..3) lies among a lane's `bits` words of one channel tile: word
/// `word`, bit `bit` (LSB = 0). Always nibble e (bit = 4e + …):
///   bits 1, 2, 4: q = tt·bits; word q / 4, bit 4e + q mod 4 + i
///   bits 3:       tt < 3: word tt, bit 4e + i;  tt = 3: word i, bit 4e + 3
struct CodeBitPos {
  int word;
  int bit;
};
constexpr CodeBitPos code_bit_pos(int bits, int tt, int e, int i) {
  if (bits == 3) return tt < 3 ? CodeBitPos{tt, 4 * e + i} : CodeBitPos{i, 4 * e + 3};
  const int q = tt * bits;
  return {q / 4, 4 * e + q % 4 + i};
}

/// One channel group of one side of one KV head.
struct GroupSpec {
  std::vector<int> channels;  ///< original head channels (GGUF order), any order, distinct
  int bits = 0;               ///< kMinBits..kMaxBits
};

/// The groups of one KV head: keys (e.g. Block-GTQ, several widths) and
/// values (e.g. one uniform group over the whole head).
struct HeadSpec {
  std::vector<GroupSpec> key;
  std::vector<GroupSpec> value;
};

/// Byte layout of one group inside a head block.
struct GroupLayout {
  int dim = 0;            ///< m: channels in the group
  int dim_pad = 0;        ///< 16·⌈m/16⌉
  int bits = 0;
  size_t code_offset = 0; ///< bytes from the head-block start
  size_t code_bytes = 0;  ///< kPageTokens · dim_pad · bits / 8
  size_t norm_offset = 0; ///< bytes from the head-block start (PageNorms)
};

/// Byte layout of one KV head's block inside a page.
struct HeadLayout {
  std::vector<GroupLayout> key, value;
  size_t block_offset = 0; ///< bytes from the page start
  size_t block_bytes = 0;
  const std::vector<GroupLayout>& side(Side s) const { return s == Side::key ? key : value; }
};

/// The layout of one layer: every KV head's groups and the page size.
/// Throws ratekv::Error on an invalid spec (bits outside 1..4, a channel out
/// of [0, head_dim) or repeated within a side, more than kMaxGroupsPerSide
/// groups, empty group).
class LayerLayout {
 public:
  LayerLayout(int head_dim, std::vector<HeadSpec> heads);

  /// Uniform TQ-MSE: one key group and one value group over the whole head.
  static LayerLayout uniform(int head_dim, int n_kv_heads, int key_bits, int value_bits);

  int head_dim() const { return head_dim_; }
  int n_kv_heads() const { return (int)heads_.size(); }
  const HeadSpec& spec(int h) const { return specs_[h]; }
  const HeadLayout& head(int h) const { return heads_[h]; }
  /// Bytes of one page (all KV heads); a multiple of 16.
  size_t page_bytes() const { return page_bytes_; }
  /// Bytes per token per KV head, averaged over heads (codes + norms).
  double bytes_per_token_per_head() const;

 private:
  int head_dim_;
  std::vector<HeadSpec> specs_;
  std::vector<HeadLayout> heads_;
  size_t page_bytes_ = 0;
};

// ---- scalar reference writer / reader (define the format) --------------------

/// Writes the `dim` codes of token slot `slot` (0..63) of group `g` of side
/// `side` of KV head `h` into `page` (page_bytes() bytes). codes[i] is the code
/// of rotated coordinate i (i < dim); padded coordinates are written as 0.
/// Throws Error on a code ≥ 2^bits or an out-of-range index.
void write_codes(const LayerLayout& L, std::span<uint8_t> page, int h, Side side, int g, int slot,
                 std::span<const uint8_t> codes);

/// Reads back what write_codes wrote (dim codes).
void read_codes(const LayerLayout& L, std::span<const uint8_t> page, int h, Side side, int g,
                int slot, std::span<uint8_t> codes);

/// Writes / reads the fp16 norm bits of one token slot of one group.
void write_norm(const LayerLayout& L, std::span<uint8_t> page, int h, Side side, int g, int slot,
                uint16_t norm_fp16);
uint16_t read_norm(const LayerLayout& L, std::span<const uint8_t> page, int h, Side side, int g,
                   int slot);

/// A host-side paged pool for one layer (reference; the GPU pool uses the
/// same bytes). Pages are zero-filled when created.
struct HostPagePool {
  const LayerLayout* layout = nullptr;
  std::vector<uint8_t> bytes;  ///< n_pages · page_bytes
  int n_pages() const { return layout ? (int)(bytes.size() / layout->page_bytes()) : 0; }
  std::span<uint8_t> page(int p);
  std::span<const uint8_t> page(int p) const;
};

}  // namespace ratekv::packed
