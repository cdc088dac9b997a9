// model/tokenizer_byte_level.cpp — the GPT-2 byte-level alphabet.
#include "model/tokenizer_byte_level.h"

#include <array>

#include "model/tokenizer_utf8.h"

namespace ratekv::tok {

namespace {

// A byte keeps its own code point when it is printable Latin-1 other than
// the soft hyphen.
constexpr bool keeps_own_code_point(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 0x144> to_byte{};  // every image code point is < U+0144
  Tables() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = keeps_own_code_point(b) ? static_cast<char32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return tables().to_cp[b]; }

std::optional<uint8_t> unicode_to_byte(char32_t cp) {
  const auto& t = tables();
  if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(t.to_byte[cp]);
}

std::string byte_level_encode(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char b : raw) utf8_append(out, byte_to_unicode(b));
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t cp = utf8_decode_one(text, pos);
    auto b = unicode_to_byte(cp);  // U+FFFD (invalid UTF-8) is no byte character
    // Byte characters are < U+0800: two bytes from U+0080 on; reject overlong forms.
    if (b && pos - start != (cp < 0x80 ? 1u : 2u)) return std::nullopt;
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

}  // namespace ratekv::tok
