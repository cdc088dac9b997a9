// ratekv/common/utf8.h — UTF-8 validation of input text (RFC 3629).
#pragma once

#include <cstddef>
#include <string_view>

namespace ratekv {

/// Byte offset of the first byte of `s` that is not part of a well-formed UTF-8
/// sequence (RFC 3629 §4: no overlong forms, no surrogates U+D800..U+DFFF, no
/// code points above U+10FFFF, no truncated sequence at the end), or
/// std::string_view::npos when all of `s` is valid UTF-8. O(|s|), no allocation.
size_t first_invalid_utf8(std::string_view s);

}  // namespace ratekv
