// Bit packing: scalar reference (bit by bit) and fast path (64-bit accumulator).
#include "ratekv/quant/bitpack.h"

#include <cstring>

#include "ratekv/common/error.h"

namespace ratekv::quant {

static void check_width(int width) {
  check(width >= 1 && width <= 16, "bit packing: width {} is out of range (expected 1..16)", width);
}

void pack_bits_ref(const uint16_t* codes, size_t n, int width, uint8_t* out) {
  check_width(width);
  std::memset(out, 0, packed_bytes(n, width));
  for (size_t i = 0; i < n; ++i) {
    check((uint32_t)codes[i] < (1u << width), "bit packing: code {} at index {} does not fit in {} bits",
          codes[i], i, width);
    for (int j = 0; j < width; ++j) {
      const size_t k = i * (size_t)width + (size_t)j;
      if ((codes[i] >> j) & 1u) out[k / 8] |= (uint8_t)(1u << (k % 8));
    }
  }
}

void unpack_bits_ref(const uint8_t* in, size_t n, int width, uint16_t* codes) {
  check_width(width);
  for (size_t i = 0; i < n; ++i) {
    uint32_t c = 0;
    for (int j = 0; j < width; ++j) {
      const size_t k = i * (size_t)width + (size_t)j;
      c |= (uint32_t)((in[k / 8] >> (k % 8)) & 1u) << j;
    }
    codes[i] = (uint16_t)c;
  }
}

namespace {

template <typename T>
void pack_fast(const T* codes, size_t n, int width, uint8_t* out) {
  check_width(width);
  const uint64_t mask = (1ull << width) - 1;
  uint64_t acc = 0;  // pending bits, LSB = next stream bit
  int nacc = 0;
  uint8_t* p = out;
  for (size_t i = 0; i < n; ++i) {
    acc |= ((uint64_t)codes[i] & mask) << nacc;
    nacc += width;
    if (nacc >= 32) {  // flush 4 whole bytes
      const uint32_t w = (uint32_t)acc;
      p[0] = (uint8_t)w;
      p[1] = (uint8_t)(w >> 8);
      p[2] = (uint8_t)(w >> 16);
      p[3] = (uint8_t)(w >> 24);
      p += 4;
      acc >>= 32;
      nacc -= 32;
    }
  }
  while (nacc > 0) {
    *p++ = (uint8_t)acc;
    acc >>= 8;
    nacc -= 8;
  }
}

template <typename T>
void unpack_fast(const uint8_t* in, size_t n, int width, T* codes) {
  check_width(width);
  const uint64_t mask = (1ull << width) - 1;
  const size_t nbytes = packed_bytes(n, width);
  uint64_t acc = 0;
  int nacc = 0;
  size_t pos = 0;  // next byte to load
  for (size_t i = 0; i < n; ++i) {
    if (nacc < width) {
      // Refill up to 4 bytes at once (never reading past the packed buffer).
      if (pos + 4 <= nbytes) {
        const uint64_t w = (uint64_t)in[pos] | ((uint64_t)in[pos + 1] << 8) | ((uint64_t)in[pos + 2] << 16) |
                           ((uint64_t)in[pos + 3] << 24);
        acc |= w << nacc;
        nacc += 32;
        pos += 4;
      } else {
        while (nacc < width && pos < nbytes) {
          acc |= (uint64_t)in[pos++] << nacc;
          nacc += 8;
        }
      }
    }
    codes[i] = (T)(acc & mask);
    acc >>= width;
    nacc -= width;
  }
}

}  // namespace

void pack_bits(const uint16_t* codes, size_t n, int width, uint8_t* out) { pack_fast(codes, n, width, out); }
void unpack_bits(const uint8_t* in, size_t n, int width, uint16_t* codes) { unpack_fast(in, n, width, codes); }
void pack_bits(const uint8_t* codes, size_t n, int width, uint8_t* out) {
  check(width <= 8, "bit packing: width {} does not fit 8-bit codes (expected 1..8)", width);
  pack_fast(codes, n, width, out);
}
void unpack_bits(const uint8_t* in, size_t n, int width, uint8_t* codes) {
  check(width <= 8, "bit packing: width {} does not fit 8-bit codes (expected 1..8)", width);
  unpack_fast(in, n, width, codes);
}

}  // namespace ratekv::quant
