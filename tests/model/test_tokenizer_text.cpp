// UTF-8 canonicalization and the GPT-2 byte-level alphabet used by the
// tokenizer (src/model/tokenizer_utf8.h, tokenizer_byte_level.h).
#include <gtest/gtest.h>

#include <set>

#include "model/tokenizer_byte_level.h"
#include "model/tokenizer_utf8.h"

using namespace ratekv::tok;
using namespace std::string_literals;

TEST(TokenizerUtf8, ValidTextIsUnchanged) {
  const std::string s = "plain ASCII, caf\xC3\xA9, \xE2\x82\xAC 5, \xF0\x9F\x98\x80 emoji, \x00 nul"s;
  bool sur = true;
  EXPECT_EQ(utf8_canonicalize(s, &sur), s);
  EXPECT_FALSE(sur);
}

TEST(TokenizerUtf8, InvalidBytesBecomeReplacementCharacters) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_canonicalize("a\xFF" "b"), "a" + fffd + "b");                 // 0xF8..0xFF lead
  EXPECT_EQ(utf8_canonicalize("\x80x"), fffd + "x");                         // stray continuation
  EXPECT_EQ(utf8_canonicalize("\xE2\x82"), fffd + fffd);                     // truncated: one per byte
  EXPECT_EQ(utf8_canonicalize("\xE2\x28\xA1"), fffd + "(" + fffd);           // bad continuation
  EXPECT_EQ(utf8_canonicalize("\xF5\x80\x80\x80"), fffd);                    // > U+10FFFF
  // Overlong forms are decoded, not rejected (as llama.cpp): 0xC0 0xAF is '/'.
  EXPECT_EQ(utf8_canonicalize("\xC0\xAF"), "/");
  EXPECT_EQ(utf8_canonicalize("\xE0\x80\x80"), std::string(1, '\0'));
}

TEST(TokenizerUtf8, SurrogatesAreKeptAndFlagged) {
  bool sur = false;
  EXPECT_EQ(utf8_canonicalize("x\xED\xA0\x80y", &sur), "x\xED\xA0\x80y");
  EXPECT_TRUE(sur);
}

TEST(TokenizerUtf8, DecodeOneAdvances) {
  const std::string s = "\xF0\x9F\xA6\x99!";
  size_t pos = 0;
  EXPECT_EQ(utf8_decode_one(s, pos), char32_t{0x1F999});
  EXPECT_EQ(pos, 4u);
  EXPECT_EQ(utf8_decode_one(s, pos), char32_t{'!'});
  EXPECT_EQ(pos, 5u);
}

TEST(TokenizerByteLevel, KnownCharacters) {
  EXPECT_EQ(byte_to_unicode(' '), char32_t{0x120});   // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), char32_t{0x10A});  // 'Ċ'
  EXPECT_EQ(byte_to_unicode('\t'), char32_t{0x109});  // 'ĉ'
  EXPECT_EQ(byte_to_unicode(0x00), char32_t{0x100});
  EXPECT_EQ(byte_to_unicode(0x7F), char32_t{0x121});  // after the 33 bytes 0x00..0x20
  EXPECT_EQ(byte_to_unicode(0xA0), char32_t{0x142});
  EXPECT_EQ(byte_to_unicode(0xAD), char32_t{0x143});  // soft hyphen: the last one
  EXPECT_EQ(byte_to_unicode('a'), char32_t{'a'});
  EXPECT_EQ(byte_to_unicode(0xE9), char32_t{0xE9});
  EXPECT_EQ(byte_level_encode(" hi\n"), "\xC4\xA0hi\xC4\x8A");
}

TEST(TokenizerByteLevel, IsABijectionOnAllBytes) {
  std::set<char32_t> images;
  std::string all;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = byte_to_unicode(static_cast<uint8_t>(b));
    images.insert(cp);
    ASSERT_EQ(unicode_to_byte(cp), std::optional<uint8_t>(static_cast<uint8_t>(b))) << b;
    all.push_back(static_cast<char>(b));
  }
  EXPECT_EQ(images.size(), 256u);
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), std::optional<std::string>(all));
}

TEST(TokenizerByteLevel, DecodeRejectsNonByteCharacters) {
  EXPECT_EQ(byte_level_decode("\xC4\xA0hello"), std::optional<std::string>(" hello"));
  EXPECT_EQ(byte_level_decode(""), std::optional<std::string>(""));
  EXPECT_FALSE(byte_level_decode(" x").has_value());            // U+0020 is no byte character
  EXPECT_FALSE(byte_level_decode("\xE2\x82\xAC").has_value());  // U+20AC
  EXPECT_FALSE(byte_level_decode("\xFF").has_value());          // invalid UTF-8
  EXPECT_FALSE(byte_level_decode("\xC1\xA1").has_value());      // overlong 'a'
  EXPECT_FALSE(unicode_to_byte(0x144).has_value());
  EXPECT_FALSE(unicode_to_byte(0x20).has_value());
}
