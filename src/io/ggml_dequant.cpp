// io/ggml_dequant.cpp — ggml type table and scalar reference dequantizers.
//
// These decoders define the formats for ratekv (layouts: ggml_blocks.h). They
// read blocks with memcpy, so `src` needs no alignment.
#include <cstring>

#include "io/ggml_blocks.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/io/gguf.h"

namespace ratekv {
namespace {

struct TypeInfo {
  const char* name;
  int64_t block;   // elements per block
  int64_t bytes;   // bytes per block
};

// nullptr name = unknown value.
TypeInfo type_info(GgmlType t) {
  using namespace ggml;
  switch (t) {
    case GgmlType::F32: return {"F32", 1, 4};
    case GgmlType::F16: return {"F16", 1, 2};
    case GgmlType::BF16: return {"BF16", 1, 2};
    case GgmlType::Q4_0: return {"Q4_0", kQK, sizeof(BlockQ4_0)};
    case GgmlType::Q4_1: return {"Q4_1", kQK, sizeof(BlockQ4_1)};
    case GgmlType::Q5_0: return {"Q5_0", kQK, sizeof(BlockQ5_0)};
    case GgmlType::Q5_1: return {"Q5_1", kQK, sizeof(BlockQ5_1)};
    case GgmlType::Q8_0: return {"Q8_0", kQK, sizeof(BlockQ8_0)};
    case GgmlType::Q8_1: return {"Q8_1", kQK, kBytesQ8_1};
    case GgmlType::Q2_K: return {"Q2_K", kQK_K, kBytesQ2_K};
    case GgmlType::Q3_K: return {"Q3_K", kQK_K, kBytesQ3_K};
    case GgmlType::Q4_K: return {"Q4_K", kQK_K, sizeof(BlockQ4_K)};
    case GgmlType::Q5_K: return {"Q5_K", kQK_K, sizeof(BlockQ5_K)};
    case GgmlType::Q6_K: return {"Q6_K", kQK_K, sizeof(BlockQ6_K)};
    case GgmlType::Q8_K: return {"Q8_K", kQK_K, kBytesQ8_K};
    case GgmlType::I8: return {"I8", 1, 1};
    case GgmlType::I16: return {"I16", 1, 2};
    case GgmlType::I32: return {"I32", 1, 4};
    case GgmlType::I64: return {"I64", 1, 8};
    case GgmlType::F64: return {"F64", 1, 8};
  }
  return {nullptr, 0, 0};
}

template <typename Block>
Block load(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof(Block));
  return b;
}

// Unpacks the j-th (6-bit scale, 6-bit min) pair of a K-quant scales[12]:
// pairs 0..3 are the low 6 bits of bytes j and j+4; pairs 4..7 take their low
// 4 bits from byte j+4 (scale: low nibble, min: high nibble) and their top 2
// bits from the spare top bits of bytes j-4 (scale) and j (min).
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void deq_q4_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += ggml::kQK) {
    const auto b = load<ggml::BlockQ4_0>(src + i * sizeof(ggml::BlockQ4_0));
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < ggml::kQK / 2; ++j) {
      y[j] = d * (float)((b.qs[j] & 0x0F) - 8);
      y[j + 16] = d * (float)((b.qs[j] >> 4) - 8);
    }
  }
}

void deq_q4_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += ggml::kQK) {
    const auto b = load<ggml::BlockQ4_1>(src + i * sizeof(ggml::BlockQ4_1));
    const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
    for (int j = 0; j < ggml::kQK / 2; ++j) {
      y[j] = d * (float)(b.qs[j] & 0x0F) + m;
      y[j + 16] = d * (float)(b.qs[j] >> 4) + m;
    }
  }
}

uint32_t le32(const uint8_t* p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void deq_q5_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += ggml::kQK) {
    const auto b = load<ggml::BlockQ5_0>(src + i * sizeof(ggml::BlockQ5_0));
    const float d = fp16_to_fp32(b.d);
    const uint32_t qh = le32(b.qh);
    for (int j = 0; j < ggml::kQK / 2; ++j) {
      const int lo = (b.qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
      const int hi = (b.qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
      y[j] = d * (float)(lo - 16);
      y[j + 16] = d * (float)(hi - 16);
    }
  }
}

void deq_q5_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += ggml::kQK) {
    const auto b = load<ggml::BlockQ5_1>(src + i * sizeof(ggml::BlockQ5_1));
    const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
    const uint32_t qh = le32(b.qh);
    for (int j = 0; j < ggml::kQK / 2; ++j) {
      const int lo = (b.qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
      const int hi = (b.qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
      y[j] = d * (float)lo + m;
      y[j + 16] = d * (float)hi + m;
    }
  }
}

void deq_q8_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += ggml::kQK) {
    const auto b = load<ggml::BlockQ8_0>(src + i * sizeof(ggml::BlockQ8_0));
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < ggml::kQK; ++j) y[j] = d * (float)b.qs[j];
  }
}

// Q4_K: super-block of 256 = 4 groups of 64; group g uses qs[32g..32g+31],
// low nibbles -> sub-block 2g, high nibbles -> sub-block 2g+1.
void deq_q4_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load<ggml::BlockQ4_K>(src + i * sizeof(ggml::BlockQ4_K));
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int g = 0; g < 4; ++g) {
      int sc0, m0, sc1, m1;
      scale_min_k4(2 * g, b.scales, &sc0, &m0);
      scale_min_k4(2 * g + 1, b.scales, &sc1, &m1);
      const float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
      const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
      const uint8_t* q = b.qs + 32 * g;
      for (int l = 0; l < 32; ++l) y[l] = d0 * (float)(q[l] & 0x0F) - mm0;
      for (int l = 0; l < 32; ++l) y[32 + l] = d1 * (float)(q[l] >> 4) - mm1;
      y += 64;
    }
  }
}

// Q5_K: as Q4_K; the 5th bit of weight l of sub-block s is bit s of qh[l].
void deq_q5_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load<ggml::BlockQ5_K>(src + i * sizeof(ggml::BlockQ5_K));
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int g = 0; g < 4; ++g) {
      int sc0, m0, sc1, m1;
      scale_min_k4(2 * g, b.scales, &sc0, &m0);
      scale_min_k4(2 * g + 1, b.scales, &sc1, &m1);
      const float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
      const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
      const uint8_t* q = b.qs + 32 * g;
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] & 0x0F) | (((b.qh[l] >> (2 * g)) & 1) << 4);
        y[l] = d0 * (float)v - mm0;
      }
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] >> 4) | (((b.qh[l] >> (2 * g + 1)) & 1) << 4);
        y[32 + l] = d1 * (float)v - mm1;
      }
      y += 64;
    }
  }
}

// Q6_K: two halves of 128; in half h, for l < 32, byte ql[64h+l] holds weights
// l (low nibble) and l+64 (high), ql[64h+32+l] weights l+32 and l+96, and
// qh[32h+l] their 2-bit tops at bit pairs 0,2,4,6 (l, l+32, l+64, l+96).
// Sub-block scale index = 8h + (position within half) / 16.
void deq_q6_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load<ggml::BlockQ6_K>(src + i * sizeof(ggml::BlockQ6_K));
    const float d = fp16_to_fp32(b.d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      const int8_t* sc = b.scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * (float)sc[s] * (float)q1;
        y[l + 32] = d * (float)sc[s + 2] * (float)q2;
        y[l + 64] = d * (float)sc[s + 4] * (float)q3;
        y[l + 96] = d * (float)sc[s + 6] * (float)q4;
      }
      y += 128;
    }
  }
}

}  // namespace

std::string ggml_type_name(GgmlType t) {
  const TypeInfo ti = type_info(t);
  return ti.name ? std::string(ti.name) : "type#" + std::to_string((uint32_t)t);
}

int64_t ggml_block_size(GgmlType t) {
  const TypeInfo ti = type_info(t);
  check(ti.name != nullptr, "unsupported ggml type {}", ggml_type_name(t));
  return ti.block;
}

int64_t ggml_block_bytes(GgmlType t) {
  const TypeInfo ti = type_info(t);
  check(ti.name != nullptr, "unsupported ggml type {}", ggml_type_name(t));
  return ti.bytes;
}

bool ggml_can_dequantize(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16:
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q4_1:
    case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(GgmlType type, const void* src_v, float* dst, int64_t n) {
  check(ggml_can_dequantize(type), "dequantize: ggml type {} is not supported (supported: F32, F16, BF16, "
        "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)", ggml_type_name(type));
  const int64_t bs = ggml_block_size(type);
  check(n >= 0 && n % bs == 0, "dequantize: {} elements is not a non-negative multiple of the {} block size {}",
        n, ggml_type_name(type), bs);
  const auto* src = static_cast<const uint8_t*>(src_v);
  const int64_t nb = n / bs;
  switch (type) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, (size_t)n * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
      return;
    case GgmlType::Q4_0: return deq_q4_0(src, dst, nb);
    case GgmlType::Q4_1: return deq_q4_1(src, dst, nb);
    case GgmlType::Q5_0: return deq_q5_0(src, dst, nb);
    case GgmlType::Q5_1: return deq_q5_1(src, dst, nb);
    case GgmlType::Q8_0: return deq_q8_0(src, dst, nb);
    case GgmlType::Q4_K: return deq_q4_k(src, dst, nb);
    case GgmlType::Q5_K: return deq_q5_k(src, dst, nb);
    case GgmlType::Q6_K: return deq_q6_k(src, dst, nb);
    default: break;
  }
  fail("dequantize: ggml type {} is not supported", ggml_type_name(type));
}

}  // namespace ratekv
