// Device tables of a VqPlan (plain C++: built by vq_plan.cpp, read by
// decode_attention_vq.cu). Offsets describe the vq pages of
// docs/packed_format.md §7 (packed::VqLayerLayout).
#pragma once

#include <cstddef>
#include <cstdint>

#include "head_tables.h"
#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda::detail {

inline constexpr int kVqMaxHeadDim = 256;
inline constexpr int kVqMaxOut = kMaxTiles * 16;  // output columns (rotated value tiles of a scalar side)
inline constexpr int kVqMaxGqa = 16;
// packed::VqSideKind values (checked in vq_plan.cpp; the .cu files do not
// include packed_vq_format.h, whose codec header pulls in nlohmann::json).
inline constexpr int kVqKindVq = 1;
inline constexpr int kVqKindFp16 = 2;

/// One layer's vq pages; passed by value to the kernel.
struct VqTables {
  int head_dim = 0;
  int kind[2] = {0, 0};         // packed::VqSideKind per side (1 vq, 2 fp16)
  int n_groups[2] = {0, 0};     // G
  int bits[2] = {0, 0};         // index width
  int group_size[2] = {0, 0};   // g = head_dim / G
  int shared[2] = {0, 0};       // 1: one fp16 scale per token per side
  int64_t scale_offset[2] = {0, 0};  // bytes from the page start (shared scale)
  int64_t head_bytes = 0;       // bytes per KV head (segment_offset(h, s) = h·head_bytes + seg_offset[s])
  int64_t seg_offset[2] = {0, 0};
  int64_t page_bytes = 0;
  int neox = 0;                 // RoPE block i = (i, i + d/2), else (2i, 2i+1)
  const float* codewords = nullptr;   // C̃, per (h, side) at cw_offset[h·2 + side]
  const int64_t* cw_offset = nullptr;
  const int32_t* channels = nullptr;  // (G, g) per (h, side) at ch_offset[h·2 + side]
  const int64_t* ch_offset = nullptr;
  const double* freq = nullptr;       // (head_dim/2) θ^(−2i/d)
  // Scalar TQ-MSE values (value kind none): the scalar plan's head tables
  // and fp32 levels; its pages (scalar_page_bytes each) come as scalar_pool.
  int scalar_values = 0;
  const HeadTables* heads = nullptr;
  const float* levels = nullptr;
  int64_t scalar_page_bytes = 0;
};

}  // namespace ratekv::cuda::detail

namespace ratekv::cuda {
struct VqPlan::Device {
  detail::VqTables t;
  float* codewords = nullptr;
  int32_t* channels = nullptr;
  int64_t* offsets = nullptr;  // cw_offset then ch_offset
  double* freq = nullptr;
};
}  // namespace ratekv::cuda
