// Bit packing: the documented bit order, and the fast path bit-exact against
// the scalar reference for every width 1..16 and awkward lengths.
#include <gtest/gtest.h>

#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/quant/bitpack.h"
#include "ratekv/quant/prng.h"

using namespace ratekv;
using namespace ratekv::quant;

// The worked example in bitpack.h: w = 3, codes {5, 1, 6} -> 0x8d 0x01.
TEST(BitPack, DocumentedExample) {
  const uint16_t codes[3] = {5, 1, 6};
  uint8_t ref[2], fast[2];
  pack_bits_ref(codes, 3, 3, ref);
  pack_bits(codes, 3, 3, fast);
  EXPECT_EQ(ref[0], 0x8d);
  EXPECT_EQ(ref[1], 0x01);
  EXPECT_EQ(fast[0], 0x8d);
  EXPECT_EQ(fast[1], 0x01);
  // 10-bit codes: 0x3ff, 0x001 -> bits 1111111111 1000000000 -> ff 07 00
  const uint16_t c10[2] = {0x3ff, 0x001};
  uint8_t b10[3];
  pack_bits_ref(c10, 2, 10, b10);
  EXPECT_EQ(b10[0], 0xff);
  EXPECT_EQ(b10[1], 0x07);
  EXPECT_EQ(b10[2], 0x00);
}

TEST(BitPack, FastMatchesReferenceAllWidthsAndLengths) {
  SplitMix64 rng(7);
  for (int width = 1; width <= 16; ++width) {
    for (size_t n : {size_t(1), size_t(7), size_t(97), size_t(1000)}) {
      SCOPED_TRACE(testing::Message() << "width=" << width << " n=" << n);
      std::vector<uint16_t> codes(n);
      for (auto& c : codes) c = (uint16_t)(rng.next() & ((1u << width) - 1));
      const size_t nb = packed_bytes(n, width);
      ASSERT_EQ(nb, (n * width + 7) / 8);
      std::vector<uint8_t> ref(nb), fast(nb, 0xAB);
      pack_bits_ref(codes.data(), n, width, ref.data());
      pack_bits(codes.data(), n, width, fast.data());
      ASSERT_EQ(ref, fast);
      std::vector<uint16_t> back_ref(n), back_fast(n);
      unpack_bits_ref(ref.data(), n, width, back_ref.data());
      unpack_bits(ref.data(), n, width, back_fast.data());
      ASSERT_EQ(back_ref, codes);
      ASSERT_EQ(back_fast, codes);
      if (width <= 8) {
        std::vector<uint8_t> c8(codes.begin(), codes.end()), p8(nb), u8(n);
        pack_bits(c8.data(), n, width, p8.data());
        ASSERT_EQ(p8, ref);
        unpack_bits(ref.data(), n, width, u8.data());
        ASSERT_EQ(u8, c8);
      }
      // Unused high bits of the last byte are zero.
      if ((n * width) % 8) {
        EXPECT_EQ(ref.back() >> ((n * width) % 8), 0);
      }
    }
  }
}

TEST(BitPack, RejectsBadWidthAndOversizedCodes) {
  uint16_t c[1] = {8};
  uint8_t out[4];
  EXPECT_THROW(pack_bits_ref(c, 1, 3, out), Error);  // 8 needs 4 bits
  EXPECT_THROW(pack_bits_ref(c, 1, 0, out), Error);
  EXPECT_THROW(pack_bits(c, 1, 17, out), Error);
  uint8_t c8[1] = {1};
  EXPECT_THROW(pack_bits(c8, 1, 9, out), Error);
}
