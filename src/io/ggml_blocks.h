// io/ggml_blocks.h — on-disk block layouts of the ggml quantization formats.
//
// Each struct is the exact byte layout of one block as stored in a GGUF data
// section (little-endian, no padding; fp16 fields are IEEE binary16 bits).
// The dequantization equations live next to the scalar reference decoders in
// ggml_dequant.cpp; they are summarized here per block:
//
//   Q4_0 (32 w, 18 B):  x[j] = d * (nibble_j - 8)
//   Q4_1 (32 w, 20 B):  x[j] = d * nibble_j + m
//   Q5_0 (32 w, 22 B):  x[j] = d * (q5_j - 16),  q5 = nibble | (qh bit j) << 4
//   Q5_1 (32 w, 24 B):  x[j] = d * q5_j + m
//   Q8_0 (32 w, 34 B):  x[j] = d * qs[j]
//   Q4_K (256 w, 144 B): 8 sub-blocks of 32; x = d*sc_s*q - dmin*m_s with
//                        6-bit (sc_s, m_s) packed into scales[12]
//   Q5_K (256 w, 176 B): as Q4_K with a 5th bit per weight from qh[32]
//   Q6_K (256 w, 210 B): 16 sub-blocks of 16; x = d * sc_s * (q6 - 32),
//                        int8 sc_s, q6 = 4 low bits (ql) | 2 high bits (qh)
//
// For the 32-weight formats, byte j of qs holds weight j in its low nibble
// and weight j+16 in its high nibble.
#pragma once

#include <cstdint>

namespace ratekv::ggml {

constexpr int kQK = 32;    // weights per block of the classic formats
constexpr int kQK_K = 256; // weights per K-quant super-block

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;            // fp16 scale
  uint8_t qs[kQK / 2];   // 4-bit quants, offset 8
};
static_assert(sizeof(BlockQ4_0) == 18);

struct BlockQ4_1 {
  uint16_t d;            // fp16 scale
  uint16_t m;            // fp16 minimum (added)
  uint8_t qs[kQK / 2];   // 4-bit quants, unsigned
};
static_assert(sizeof(BlockQ4_1) == 20);

struct BlockQ5_0 {
  uint16_t d;            // fp16 scale
  uint8_t qh[4];         // 5th bit of weight j at bit j of the LE u32
  uint8_t qs[kQK / 2];   // low 4 bits
};
static_assert(sizeof(BlockQ5_0) == 22);

struct BlockQ5_1 {
  uint16_t d;            // fp16 scale
  uint16_t m;            // fp16 minimum (added)
  uint8_t qh[4];         // 5th bit of weight j at bit j of the LE u32
  uint8_t qs[kQK / 2];   // low 4 bits
};
static_assert(sizeof(BlockQ5_1) == 24);

struct BlockQ8_0 {
  uint16_t d;            // fp16 scale
  int8_t qs[kQK];        // signed 8-bit quants
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_K {
  uint16_t d;            // fp16 super-block scale of the sub-block scales
  uint16_t dmin;         // fp16 super-block scale of the sub-block minima
  uint8_t scales[12];    // 8 x (6-bit scale, 6-bit min), packed (see get_scale_min)
  uint8_t qs[kQK_K / 2]; // 4-bit quants: 4 groups of 32 bytes, each 2 sub-blocks
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8]; // 5th bits: bit 2g (low nibble) / 2g+1 (high) of byte l, group g
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];     // low 4 bits
  uint8_t qh[kQK_K / 4];     // high 2 bits
  int8_t scales[kQK_K / 16]; // 16 signed 8-bit sub-block scales
  uint16_t d;                // fp16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

// Sizes of formats the reader can size (for validation) but not dequantize.
constexpr int kBytesQ8_1 = 36;   // fp16 d, fp16 s, int8[32]
constexpr int kBytesQ2_K = 84;   // scales[16], qs[64], fp16 d, fp16 dmin
constexpr int kBytesQ3_K = 110;  // hmask[32], qs[64], scales[12], fp16 d
constexpr int kBytesQ8_K = 292;  // f32 d, int8[256], int16 bsums[16]
#pragma pack(pop)

}  // namespace ratekv::ggml
