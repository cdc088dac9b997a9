// model/tokenizer_utf8.cpp — lenient UTF-8 decoding (see tokenizer_utf8.h).
#include "model/tokenizer_utf8.h"

namespace ratekv::tok {

namespace {
constexpr char32_t kReplacement = 0xFFFD;
inline bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }
}  // namespace

char32_t utf8_decode_one(std::string_view s, size_t& pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const unsigned char c0 = p[pos];
  if (c0 < 0x80) {
    pos += 1;
    return c0;
  }
  size_t len = 0;
  char32_t cp = 0;
  if ((c0 & 0xE0) == 0xC0) {
    len = 2;
    cp = c0 & 0x1F;
  } else if ((c0 & 0xF0) == 0xE0) {
    len = 3;
    cp = c0 & 0x0F;
  } else if ((c0 & 0xF8) == 0xF0) {
    len = 4;
    cp = c0 & 0x07;
  } else {  // continuation byte as lead, or 0xF8..0xFF
    pos += 1;
    return kReplacement;
  }
  if (pos + len > n) {
    pos += 1;
    return kReplacement;
  }
  for (size_t k = 1; k < len; ++k) {
    if (!is_cont(p[pos + k])) {
      pos += 1;
      return kReplacement;
    }
    cp = (cp << 6) | (p[pos + k] & 0x3F);
  }
  pos += len;
  return cp > 0x10FFFF ? kReplacement : cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_canonicalize(std::string_view s, bool* has_surrogates) {
  std::string out;
  out.reserve(s.size());
  bool sur = false;
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path.
    const auto c = static_cast<unsigned char>(s[pos]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++pos;
      continue;
    }
    const char32_t cp = utf8_decode_one(s, pos);
    sur |= (cp >= 0xD800 && cp <= 0xDFFF);
    utf8_append(out, cp);
  }
  if (has_surrogates) *has_surrogates = sur;
  return out;
}

}  // namespace ratekv::tok
