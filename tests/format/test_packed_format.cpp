// Packed KV-cache format (docs/packed_format.md): reference writer -> reader
// round trips on awkward shapes, hand-computed golden bytes, layout arithmetic
// and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "ratekv/common/error.h"
#include "ratekv/format/packed_format.h"

using namespace ratekv::packed;

namespace {

// A Block-GTQ-like key side: RoPE blocks (2i, 2i+1) scattered over groups of
// widths {1,2,3,4} with group sizes that are not multiples of 16 (padding).
HeadSpec mixed_head(int head_dim, std::mt19937& rng) {
  std::vector<int> blocks(head_dim / 2);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  HeadSpec h;
  const int n_groups = 4;
  // Uneven cut points: 1/8, 3/8, 7/16 ... of the blocks, never empty.
  const int nb = (int)blocks.size();
  const int cuts[5] = {0, nb / 8, nb / 8 + 3 * nb / 8 + 1, nb - nb / 16 - 1, nb};
  for (int g = 0; g < n_groups; ++g) {
    GroupSpec G;
    G.bits = g + 1;
    for (int b = cuts[g]; b < cuts[g + 1]; ++b) {
      G.channels.push_back(2 * blocks[b]);
      G.channels.push_back(2 * blocks[b] + 1);
    }
    h.key.push_back(G);
  }
  GroupSpec all;
  for (int c = 0; c < head_dim; ++c) all.channels.push_back(c);
  all.bits = 3;
  h.value = {all};
  return h;
}

struct Shape {
  int head_dim;
  int n_kv_heads;
  int n_tokens;
  bool mixed;
};

// Writes random codes/norms for n_tokens through a shuffled page table, reads
// them back, and checks every code and norm bit-exactly.
void round_trip(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<HeadSpec> heads;
  for (int h = 0; h < s.n_kv_heads; ++h) {
    if (s.mixed) {
      heads.push_back(mixed_head(s.head_dim, rng));
    } else {
      heads.push_back(LayerLayout::uniform(s.head_dim, 1, 1 + h % 4, 4 - h % 4).spec(0));
    }
  }
  const LayerLayout L(s.head_dim, heads);
  const int n_pages = (s.n_tokens + kPageTokens - 1) / kPageTokens;
  std::vector<int> page_table(n_pages);
  std::iota(page_table.begin(), page_table.end(), 0);
  std::shuffle(page_table.begin(), page_table.end(), rng);
  HostPagePool pool{&L, std::vector<uint8_t>((size_t)n_pages * L.page_bytes(), 0)};

  // expected[token][head][side][group] -> codes, norm
  struct Rec {
    std::vector<uint8_t> codes;
    uint16_t norm;
  };
  std::vector<Rec> expected;
  for (int t = 0; t < s.n_tokens; ++t) {
    auto page = pool.page(page_table[t / kPageTokens]);
    for (int h = 0; h < s.n_kv_heads; ++h) {
      for (Side side : {Side::key, Side::value}) {
        for (int g = 0; g < (int)L.head(h).side(side).size(); ++g) {
          const GroupLayout& G = L.head(h).side(side)[g];
          Rec r;
          r.codes.resize(G.dim);
          for (auto& c : r.codes) c = (uint8_t)(rng() % (1u << G.bits));
          r.norm = (uint16_t)(rng() & 0x7bff);
          write_codes(L, page, h, side, g, t % kPageTokens, r.codes);
          write_norm(L, page, h, side, g, t % kPageTokens, r.norm);
          expected.push_back(std::move(r));
        }
      }
    }
  }
  size_t i = 0;
  for (int t = 0; t < s.n_tokens; ++t) {
    auto page = std::as_const(pool).page(page_table[t / kPageTokens]);
    for (int h = 0; h < s.n_kv_heads; ++h) {
      for (Side side : {Side::key, Side::value}) {
        for (int g = 0; g < (int)L.head(h).side(side).size(); ++g, ++i) {
          std::vector<uint8_t> got(L.head(h).side(side)[g].dim);
          read_codes(L, page, h, side, g, t % kPageTokens, got);
          ASSERT_EQ(got, expected[i].codes)
              << "token " << t << " head " << h << " side " << (int)side << " group " << g;
          ASSERT_EQ(read_norm(L, page, h, side, g, t % kPageTokens), expected[i].norm);
        }
      }
    }
  }
  // Slots past the last token stay zero (nothing written out of place).
  if (s.n_tokens % kPageTokens) {
    auto page = std::as_const(pool).page(page_table[n_pages - 1]);
    for (int h = 0; h < s.n_kv_heads; ++h) {
      for (int slot = s.n_tokens % kPageTokens; slot < kPageTokens; ++slot) {
        std::vector<uint8_t> got(L.head(h).key[0].dim);
        read_codes(L, page, h, Side::key, 0, slot, got);
        ASSERT_TRUE(std::all_of(got.begin(), got.end(), [](uint8_t c) { return c == 0; }));
        ASSERT_EQ(read_norm(L, page, h, Side::value, 0, slot), 0);
      }
    }
  }
}

}  // namespace

TEST(PackedFormat, RoundTripAwkwardShapes) {
  const Shape shapes[] = {
      {64, 3, 1, false},   {64, 3, 97, false},  {128, 2, 97, false}, {256, 1, 130, false},
      {64, 2, 97, true},   {128, 2, 200, true}, {256, 1, 65, true},  {128, 1, 1, true},
  };
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << s.head_dim << " heads " << s.n_kv_heads
                                      << " tokens " << s.n_tokens << " mixed " << s.mixed);
    round_trip(s, seed++);
  }
}

// d=64 K3V3 uniform: 24 + 24 bytes of codes + 2 + 2 bytes of norms = 52 per
// token per KV head (vs 2·64·2 = 256 bytes fp16).
TEST(PackedFormat, BytesPerTokenArithmetic) {
  const LayerLayout L = LayerLayout::uniform(64, 3, 3, 3);
  EXPECT_EQ(L.page_bytes(), 3u * 64u * 52u);
  EXPECT_DOUBLE_EQ(L.bytes_per_token_per_head(), 52.0);
  const LayerLayout L128 = LayerLayout::uniform(128, 8, 4, 2);
  EXPECT_DOUBLE_EQ(L128.bytes_per_token_per_head(), 64.0 + 32.0 + 4.0);
  // A 24-channel group pads to 32 rotated coordinates: 32·2/8 = 8 bytes/token.
  HeadSpec h;
  GroupSpec g24, g40;
  for (int c = 0; c < 24; ++c) g24.channels.push_back(c);
  for (int c = 24; c < 64; ++c) g40.channels.push_back(c);
  g24.bits = 2;
  g40.bits = 1;
  h.key = {g24, g40};
  h.value = {g24, g40};
  const LayerLayout Lp(64, {h});
  EXPECT_EQ(Lp.head(0).key[0].dim_pad, 32);
  EXPECT_EQ(Lp.head(0).key[1].dim_pad, 48);
  EXPECT_DOUBLE_EQ(Lp.bytes_per_token_per_head(), 2 * (8.0 + 6.0) + 4 * 2.0);
  EXPECT_EQ(Lp.page_bytes() % 16, 0u);
}

// Hand-computed golden bytes: one head, one key group of 16 channels at 2 bits,
// token slot 0, code of channel c = c mod 4, norm 1.5 (fp16 0x3E00).
// Key order for r = 0: lane = (c mod 8)/2, element e = 2·(c/8) + c mod 2; a
// 2-bit code of token tile 0 sits in word 0, nibble e (bits 4e, 4e+1).
//   lane 0 holds channels 0,1,8,9 (codes 0,1,0,1): word 0x00001010
//   lane 1 holds channels 2,3,10,11 (codes 2,3,2,3): word 0x00003232
//   lanes 2, 3 repeat lanes 0, 1; word of lane L at byte 4L (little endian).
TEST(PackedFormat, GoldenBytesTinyKey) {
  HeadSpec h;
  GroupSpec g;
  for (int c = 0; c < 16; ++c) g.channels.push_back(c);
  g.bits = 2;
  h.key = {g};
  g.bits = 1;
  h.value = {g};
  const LayerLayout L(16, {h});
  ASSERT_EQ(L.page_bytes(), 64u * 16u * 2u / 8u + 64u * 16u / 8u + 128u + 128u);
  std::vector<uint8_t> page(L.page_bytes(), 0);
  std::vector<uint8_t> codes(16);
  for (int c = 0; c < 16; ++c) codes[c] = (uint8_t)(c % 4);
  write_codes(L, page, 0, Side::key, 0, 0, codes);
  write_norm(L, page, 0, Side::key, 0, 0, 0x3E00);
  std::vector<uint8_t> expect(L.page_bytes(), 0);
  for (int l = 0; l < 4; ++l) {
    const uint8_t byte = l % 2 ? 0x32 : 0x10;
    expect[4 * l] = byte;
    expect[4 * l + 1] = byte;
  }
  const size_t norm_at = 256 + 128;  // after key codes (256 B) and value codes (128 B)
  expect[norm_at] = 0x00;
  expect[norm_at + 1] = 0x3E;
  EXPECT_EQ(page, expect);

  // Values are transposed: slot r=3, channel 9, 1 bit, code 1 ->
  // lane = 4·(9 mod 8) + (3 mod 8)/2 = 5, e = 4·(9/8) + 2·(3/8) + 3 mod 2 = 5,
  // 1 bit, token tile 0: word 0, bit 4·5 = 20 -> byte 4·5 + 2, bit 4.
  std::vector<uint8_t> vcodes(16, 0);
  vcodes[9] = 1;
  write_codes(L, page, 0, Side::value, 0, 3, vcodes);
  expect[256 + 22] = 1u << 4;
  EXPECT_EQ(page, expect);
  // Slot 63 = token tile 3, row 15 of a 2-bit key: word 1, nibble bits 2..3.
  // Channel 0, r = 15: lane 4·7 = 28, e = 4; code 3 -> bits 18, 19 of word 1.
  std::vector<uint8_t> k63(16, 0);
  k63[0] = 3;
  write_codes(L, page, 0, Side::key, 0, 63, k63);
  expect[128 + 4 * 28 + 2] = 0x0C;
  EXPECT_EQ(page, expect);
}

// Every (word, bit) of a lane's b words is the home of exactly one
// (token tile, element, code bit), and each code's bits share one nibble.
TEST(PackedFormat, CodeBitPositionsCoverEveryBitOnce) {
  for (int b = 1; b <= 4; ++b) {
    std::vector<int> hits(32 * b, 0);
    for (int tt = 0; tt < 4; ++tt)
      for (int e = 0; e < 8; ++e)
        for (int i = 0; i < b; ++i) {
          const CodeBitPos p = code_bit_pos(b, tt, e, i);
          ASSERT_GE(p.word, 0);
          ASSERT_LT(p.word, b);
          ASSERT_EQ(p.bit / 4, e) << "bits " << b << " tt " << tt;
          ++hits[32 * p.word + p.bit];
        }
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; })) << b;
  }
}

TEST(PackedFormat, ElementPositionsCoverEveryBitOnce) {
  for (Side side : {Side::key, Side::value}) {
    std::vector<int> hits(256, 0);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        const ElementPos e = element_pos(side, r, c);
        ASSERT_GE(e.lane, 0);
        ASSERT_LT(e.lane, 32);
        ASSERT_GE(e.elem, 0);
        ASSERT_LT(e.elem, 8);
        ++hits[e.lane * 8 + e.elem];
      }
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  }
}

TEST(PackedFormat, RejectsBadSpecsAndIndices) {
  EXPECT_THROW(LayerLayout::uniform(64, 1, 5, 3), ratekv::Error);
  EXPECT_THROW(LayerLayout::uniform(64, 1, 0, 3), ratekv::Error);
  HeadSpec h;
  h.key = {GroupSpec{{0, 1, 1}, 2}};
  h.value = {GroupSpec{{0, 1}, 2}};
  EXPECT_THROW(LayerLayout(2, {h}), ratekv::Error);  // repeated channel
  h.key = {GroupSpec{{0, 2}, 2}};
  EXPECT_THROW(LayerLayout(2, {h}), ratekv::Error);  // channel out of range
  const LayerLayout L = LayerLayout::uniform(64, 1, 2, 2);
  std::vector<uint8_t> page(L.page_bytes(), 0);
  std::vector<uint8_t> codes(64, 4);  // 4 does not fit in 2 bits
  EXPECT_THROW(write_codes(L, page, 0, Side::key, 0, 0, codes), ratekv::Error);
  codes.assign(64, 1);
  EXPECT_THROW(write_codes(L, page, 0, Side::key, 0, 64, codes), ratekv::Error);
  EXPECT_THROW(write_codes(L, page, 1, Side::key, 0, 0, codes), ratekv::Error);
  std::vector<uint8_t> short_page(L.page_bytes() - 16, 0);
  EXPECT_THROW(write_codes(L, short_page, 0, Side::key, 0, 0, codes), ratekv::Error);
}
