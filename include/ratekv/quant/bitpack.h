// ratekv/quant/bitpack.h — tight packing of integer codes of any width 1..16.
//
// Bit order (the specification): codes form one little-endian bit stream.
// Code i of width w occupies stream bits [i·w, (i+1)·w), its least significant
// bit first; stream bit k is bit (k mod 8) of byte k/8 (LSB-first). So a 3-bit
// code takes exactly 3 bits and n codes take ceil(n·w/8) bytes; unused high
// bits of the last byte are zero. Example w=3, codes {5, 1, 6}: stream bits
// 101 100 011 (LSB first) -> byte 0 = 0b10001101 = 0x8d, byte 1 = 0x01.
//
// pack_bits_ref / unpack_bits_ref define the format bit by bit; pack_bits /
// unpack_bits are the fast word-at-a-time path, tested bit-exact against them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ratekv::quant {

/// Bytes needed for n codes of `width` bits: ceil(n·width/8).
constexpr size_t packed_bytes(size_t n, int width) { return (n * (size_t)width + 7) / 8; }

/// Scalar reference packer. codes: (n) values < 2^width; out: packed_bytes(n,
/// width) bytes, fully overwritten. Throws Error if width ∉ [1,16] or a code
/// does not fit in `width` bits.
void pack_bits_ref(const uint16_t* codes, size_t n, int width, uint8_t* out);

/// Scalar reference unpacker: inverse of pack_bits_ref. Throws Error if
/// width ∉ [1,16].
void unpack_bits_ref(const uint8_t* in, size_t n, int width, uint16_t* codes);

/// Fast packer (64-bit accumulator); same output as pack_bits_ref. Codes are
/// masked to `width` bits (no validation: callers produce valid codes).
/// Throws Error if width ∉ [1,16].
void pack_bits(const uint16_t* codes, size_t n, int width, uint8_t* out);

/// Fast unpacker; same output as unpack_bits_ref. Throws Error if width ∉ [1,16].
void unpack_bits(const uint8_t* in, size_t n, int width, uint16_t* codes);

/// 8-bit-code overloads of the fast path (codebook indices of b ≤ 8 bits).
void pack_bits(const uint8_t* codes, size_t n, int width, uint8_t* out);
void unpack_bits(const uint8_t* in, size_t n, int width, uint8_t* codes);

}  // namespace ratekv::quant
