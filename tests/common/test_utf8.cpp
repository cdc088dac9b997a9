// first_invalid_utf8 against RFC 3629's well-formed byte sequences: every code
// point class at its boundaries, and the ill-formed cases (stray continuation,
// C0/C1 and F5..FF leads, overlong 3- and 4-byte forms, surrogates, > U+10FFFF,
// truncated sequences) at the offset where they start.
#include <gtest/gtest.h>

#include <string>

#include "ratekv/common/utf8.h"

namespace {

using ratekv::first_invalid_utf8;
constexpr size_t kOk = std::string_view::npos;

// UTF-8 encoding of code point cp (valid scalar values only), written here
// independently of the validator.
std::string encode(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

TEST(Utf8, EveryScalarValueIsValidAndEverySurrogateIsNot) {
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const std::string e = encode(cp);
    const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
    ASSERT_EQ(first_invalid_utf8("ab" + e), surrogate ? 2 : kOk) << std::hex << (uint32_t)cp;
  }
}

TEST(Utf8, IllFormedSequencesAtTheirOffset) {
  EXPECT_EQ(first_invalid_utf8(""), kOk);
  EXPECT_EQ(first_invalid_utf8("plain ASCII\n"), kOk);
  EXPECT_EQ(first_invalid_utf8("Caf\xE9 au lait"), 3u);        // Latin-1 é
  EXPECT_EQ(first_invalid_utf8("x\x80"), 1u);                   // stray continuation
  EXPECT_EQ(first_invalid_utf8("\xC0\xAF"), 0u);                // overlong '/' (C0)
  EXPECT_EQ(first_invalid_utf8("\xC1\xBF"), 0u);                // overlong (C1)
  EXPECT_EQ(first_invalid_utf8("ok\xE0\x80\xAF"), 2u);          // overlong 3-byte
  EXPECT_EQ(first_invalid_utf8("\xF0\x80\x80\xAF"), 0u);        // overlong 4-byte
  EXPECT_EQ(first_invalid_utf8("\xED\xA0\x80"), 0u);            // U+D800
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);        // U+110000
  EXPECT_EQ(first_invalid_utf8("\xF5\x80\x80\x80"), 0u);        // F5 lead
  EXPECT_EQ(first_invalid_utf8("\xFF"), 0u);
  EXPECT_EQ(first_invalid_utf8("ab\xE2\x82"), 2u);              // truncated € at the end
  EXPECT_EQ(first_invalid_utf8("\xE2\x82x"), 0u);               // bad third byte
  EXPECT_EQ(first_invalid_utf8("\xF0\x9F\x98"), 0u);            // truncated 4-byte
  EXPECT_EQ(first_invalid_utf8("\xE2\x82\xAC\xF0\x9F\x98\x80 ok"), kOk);  // € 😀
  EXPECT_EQ(first_invalid_utf8(std::string("a\0b", 3)), kOk);   // NUL is valid UTF-8
}

}  // namespace
