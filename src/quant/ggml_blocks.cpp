// llama.cpp q8_0 / q4_0 block formats, bit-exact with ggml's reference quantizers.
#include "ratekv/quant/ggml_blocks.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::quant {

static void check_k(int64_t k, const char* fmt_name) {
  check(k >= 0 && k % kGgmlBlock == 0, "{}: row length {} is not a multiple of {}", fmt_name, k, kGgmlBlock);
}

void quantize_row_q8_0_ref(const float* x, BlockQ8_0* y, int64_t k) {
  check_k(k, "q8_0");
  for (int64_t i = 0; i < k / kGgmlBlock; ++i) {
    const float* xb = x + i * kGgmlBlock;
    float amax = 0.0f;
    for (int j = 0; j < kGgmlBlock; ++j) {
      check(std::isfinite(xb[j]), "q8_0: non-finite value at element {}", i * kGgmlBlock + j);
      amax = std::max(amax, std::fabs(xb[j]));
    }
    const float d = amax / 127.0f;
    check(std::isfinite(fp16_to_fp32(fp32_to_fp16(d))), "q8_0: block {} (max |x| = {}) overflows the fp16 scale", i,
          amax);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kGgmlBlock; ++j) y[i].qs[j] = (int8_t)std::round(xb[j] * id);
  }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t k) {
  check_k(k, "q8_0");
  for (int64_t i = 0; i < k / kGgmlBlock; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kGgmlBlock; ++j) y[i * kGgmlBlock + j] = (float)x[i].qs[j] * d;
  }
}

void quantize_row_q4_0_ref(const float* x, BlockQ4_0* y, int64_t k) {
  check_k(k, "q4_0");
  for (int64_t i = 0; i < k / kGgmlBlock; ++i) {
    const float* xb = x + i * kGgmlBlock;
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < kGgmlBlock; ++j) {
      check(std::isfinite(xb[j]), "q4_0: non-finite value at element {}", i * kGgmlBlock + j);
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        mx = xb[j];
      }
    }
    const float d = mx / -8.0f;
    check(std::isfinite(fp16_to_fp32(fp32_to_fp16(d))), "q4_0: block {} (max |x| = {}) overflows the fp16 scale", i,
          amax);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kGgmlBlock / 2; ++j) {
      const float x0 = xb[j] * id, x1 = xb[j + kGgmlBlock / 2] * id;
      const uint8_t q0 = (uint8_t)std::min<int>(15, (int8_t)(x0 + 8.5f));
      const uint8_t q1 = (uint8_t)std::min<int>(15, (int8_t)(x1 + 8.5f));
      y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t k) {
  check_k(k, "q4_0");
  for (int64_t i = 0; i < k / kGgmlBlock; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kGgmlBlock / 2; ++j) {
      y[i * kGgmlBlock + j] = (float)((x[i].qs[j] & 0x0f) - 8) * d;
      y[i * kGgmlBlock + j + kGgmlBlock / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

GgmlBlockQuantizer::GgmlBlockQuantizer(GgmlType type, int dim) : type_(type), dim_(dim) {
  check(dim > 0 && dim % kGgmlBlock == 0, "{}: dim {} must be a positive multiple of {}",
        type == GgmlType::q8_0 ? "q8_0" : "q4_0", dim, kGgmlBlock);
}

double GgmlBlockQuantizer::bits_per_element(int64_t T) const {
  check(T >= 1, "ggml block quantizer: bits_per_element needs T ≥ 1, got {}", T);
  return type_ == GgmlType::q8_0 ? 34.0 * 8 / 32 : 18.0 * 8 / 32;
}

nlohmann::json GgmlBlockQuantizer::to_json() const {
  return {{"kind", type_ == GgmlType::q8_0 ? "q8_0" : "q4_0"}, {"dim", dim_}};
}

void GgmlBlockQuantizer::fake_quant(const float* x, int64_t T, float* xhat) const {
  check(T >= 0, "ggml block quantizer: fake_quant got T = {} rows", T);
  const int64_t n = T * dim_;
  detail::check_finite(x, n, type_ == GgmlType::q8_0 ? "q8_0: input" : "q4_0: input");
  const int64_t nb = n / kGgmlBlock;
  if (type_ == GgmlType::q8_0) {
    std::vector<BlockQ8_0> b(nb);
    quantize_row_q8_0_ref(x, b.data(), n);
    dequantize_row_q8_0(b.data(), xhat, n);
  } else {
    std::vector<BlockQ4_0> b(nb);
    quantize_row_q4_0_ref(x, b.data(), n);
    dequantize_row_q4_0(b.data(), xhat, n);
  }
}

}  // namespace ratekv::quant
