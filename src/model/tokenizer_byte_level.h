// model/tokenizer_byte_level.h — the GPT-2 byte-level alphabet.
//
// GPT-2 BPE works on "byte characters": every byte 0..255 is mapped to one
// printable Unicode code point so that vocabulary and merge strings are
// readable text. Bytes '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF map to the
// code point of the same value; the remaining 68 bytes (controls, space, DEL,
// 0x80..0xA0, 0xAD), in increasing order, map to U+0100, U+0101, ... U+0143.
// (Radford et al. 2019, "bytes_to_unicode" of the GPT-2 encoder.) Example: the
// space byte 0x20 is 'Ġ' (U+0120), '\n' is 'Ċ' (U+010A).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ratekv::tok {

/// Code point that byte `b` is written as in a byte-level vocabulary.
char32_t byte_to_unicode(uint8_t b);
/// The byte that code point `cp` stands for; nullopt if `cp` is not one of
/// the 256 byte characters.
std::optional<uint8_t> unicode_to_byte(char32_t cp);

/// Raw bytes -> byte-level text (each byte becomes its character, UTF-8).
std::string byte_level_encode(std::string_view raw);
/// Byte-level text (UTF-8) -> raw bytes. Returns nullopt if the text holds a
/// character that is not a byte character or is not valid UTF-8.
std::optional<std::string> byte_level_decode(std::string_view text);

}  // namespace ratekv::tok
