// ratekv/quant/int_quant.h — uniform integer quantization of one group of
// elements with fp16 metadata: the primitive under KIVI and QuaRot.
//
// Asymmetric, b ∈ [1,8] (KIVI): z = fp16(min x), s = fp16((max x − z)/(2^b − 1)),
//   q = clamp(nearbyint((x − z)/s), 0, 2^b − 1) (ties to even; q = 0 if s = 0),
//   x̂ = z + s·q. The fp16-rounded s and z are used for the codes, so x̂ is
//   exactly what a reader of the stored bytes gets. Metadata 32 bits/group.
// Symmetric, b ∈ [2,8] (QuaRot): L = 2^(b−1) − 1, s = fp16(max|x| / L),
//   q = clamp(nearbyint(x/s), −L, L), stored as q + L ∈ [0, 2L]; x̂ = s·(code − L).
//   Metadata 16 bits/group.
// Elements are read with a stride so a group can be a channel over tokens.
#pragma once

#include <cstdint>

namespace ratekv::quant {

/// fp16 bit patterns of one group's scale (and zero for asymmetric).
struct IntGroupParams {
  uint16_t scale = 0;
  uint16_t zero = 0;
};

/// Asymmetric quantization of x[0], x[stride], …, x[(n−1)·stride] into
/// codes[0..n). Throws Error if bits ∉ [1,8], n < 1, or a value is
/// non-finite or its range overflows fp16.
IntGroupParams quantize_asym(const float* x, int64_t n, int64_t stride, int bits, uint8_t* codes);
/// x[i·stride] = z + s·codes[i].
void dequantize_asym(const uint8_t* codes, int64_t n, IntGroupParams p, float* x, int64_t stride);

/// Symmetric quantization (see file comment). Throws Error if bits ∉ [2,8],
/// n < 1, or a value is non-finite or overflows fp16.
IntGroupParams quantize_sym(const float* x, int64_t n, int64_t stride, int bits, uint8_t* codes);
void dequantize_sym(const uint8_t* codes, int64_t n, int bits, IntGroupParams p, float* x, int64_t stride);

}  // namespace ratekv::quant
