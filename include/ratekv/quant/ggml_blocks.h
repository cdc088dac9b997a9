// ratekv/quant/ggml_blocks.h — llama.cpp's KV-cache block formats q8_0 and
// q4_0 (ggml), reimplemented bit-exact with ggml's reference quantizers
// (quantize_row_q8_0_ref / quantize_row_q4_0_ref semantics) so that ratekv can
// compare with `llama.cpp -ctk/-ctv q8_0|q4_0` on equal terms.
//
// Both formats cut a row into blocks of 32 consecutive values.
//   q8_0: d = amax/127 (fp32), id = d ? 1/d : 0, qs[j] = roundf(x[j]·id)
//         (half away from zero), stored d = fp16(d) (round to nearest even).
//         x̂[j] = fp16→fp32(d)·qs[j]. 34 bytes / 32 values = 8.5 bits/element.
//   q4_0: max = the value of largest |x| (first one on ties, sign kept),
//         d = max/−8, id = d ? 1/d : 0, q = min(15, (int8)(x·id + 8.5)) (truncation),
//         byte j (0..15) = q[j] | q[j+16] << 4; x̂ = (q − 8)·fp16→fp32(d).
//         18 bytes / 32 values = 4.5 bits/element.
// Tested against bytes produced by ggml itself (tests/fixtures/quant/,
// written by tools/ref/ggml_quant_fixture.cpp).
#pragma once

#include <cstdint>

#include "ratekv/quant/quantizer.h"

namespace ratekv::quant {

constexpr int kGgmlBlock = 32;  // values per block (QK8_0 = QK4_0 = 32)

#pragma pack(push, 1)
/// ggml block_q8_0: fp16 scale + 32 int8 codes.
struct BlockQ8_0 {
  uint16_t d;       // fp16 bits
  int8_t qs[kGgmlBlock];
};
/// ggml block_q4_0: fp16 scale + 32 nibbles (low nibble: value j, high: value j+16).
struct BlockQ4_0 {
  uint16_t d;       // fp16 bits
  uint8_t qs[kGgmlBlock / 2];
};
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34, "block_q8_0 is 34 bytes");
static_assert(sizeof(BlockQ4_0) == 18, "block_q4_0 is 18 bytes");

/// x: (k) fp32, k a multiple of 32; y: (k/32) blocks. Throws Error if k is
/// not a multiple of 32, x holds a non-finite value, or a block's scale
/// overflows fp16 (where ggml would silently store inf).
void quantize_row_q8_0_ref(const float* x, BlockQ8_0* y, int64_t k);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t k);
void quantize_row_q4_0_ref(const float* x, BlockQ4_0* y, int64_t k);
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t k);

enum class GgmlType { q8_0, q4_0 };

/// The ggml formats as a per-vector Quantizer over rows of dim (a multiple of 32).
/// JSON: {"kind":"q8_0","dim":d} / {"kind":"q4_0","dim":d}.
class GgmlBlockQuantizer final : public Quantizer {
 public:
  /// Throws Error unless dim is a positive multiple of 32.
  GgmlBlockQuantizer(GgmlType type, int dim);
  GgmlType type() const { return type_; }

  QuantKind kind() const override { return type_ == GgmlType::q8_0 ? QuantKind::ggml_q8_0 : QuantKind::ggml_q4_0; }
  QuantScope scope() const override { return QuantScope::per_vector; }
  int dim() const override { return dim_; }
  double code_bits_per_element() const override { return type_ == GgmlType::q8_0 ? 8.0 : 4.0; }
  double bits_per_element(int64_t T) const override;
  using Quantizer::bits_per_element;  // the steady-state overload
  nlohmann::json to_json() const override;
  /// Throws Error on non-finite input (ggml itself would produce garbage).
  void fake_quant(const float* x, int64_t T, float* xhat) const override;

 private:
  GgmlType type_;
  int dim_;
};

}  // namespace ratekv::quant
