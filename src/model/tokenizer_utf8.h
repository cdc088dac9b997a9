// model/tokenizer_utf8.h — lenient UTF-8 decoding, as the tokenizer reference
// (llama.cpp) performs it before pre-tokenization.
//
// Rules (llama.cpp unicode_cpts_from_utf8): the lead byte's high bits give the
// sequence length (0xxxxxxx: 1, 110xxxxx: 2, 1110xxxx: 3, 11110xxx: 4); the
// continuation bytes must be 10xxxxxx and present. Anything else (a stray
// continuation byte, a 0xF8..0xFF lead, a truncated sequence) becomes U+FFFD
// and consumes exactly one byte. Overlong forms and surrogates are NOT
// rejected: they decode to their (possibly non-canonical) code point. We
// additionally map code points above U+10FFFF (from 0xF5..0xF7 leads), which
// llama.cpp cannot re-encode (it throws), to U+FFFD.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ratekv::tok {

/// Decodes one code point at `pos` (< s.size()) with the rules above and
/// advances `pos` past it (by 1 for an invalid byte).
char32_t utf8_decode_one(std::string_view s, size_t& pos);

/// Appends the canonical UTF-8 encoding of `cp` (<= U+10FFFF) to `out`.
void utf8_append(std::string& out, char32_t cp);

/// The canonical re-encoding of `s`: every code point decoded leniently and
/// re-encoded (invalid bytes -> "\xEF\xBF\xBD"). This is the text that
/// llama.cpp actually tokenizes. `has_surrogates` is set when the result
/// contains an encoded surrogate (U+D800..U+DFFF), which PCRE2 cannot match in
/// UTF mode (see PreTokenizer).
std::string utf8_canonicalize(std::string_view s, bool* has_surrogates = nullptr);

}  // namespace ratekv::tok
