// Device tables of a VqEncodePlan (plain C++: built by vq_encode_plan.cpp,
// read by vq_encode.cu). Offsets describe the vq pages of
// docs/packed_format.md §7 (packed::VqLayerLayout).
#pragma once

#include <cstdint>

#include "ratekv/cuda/vq_encode.h"

namespace ratekv::cuda::detail {

inline constexpr int kVqEncodeMaxHeadDim = 256;
// n_kv_heads · head_dim floats of dynamic shared memory (32 KiB: with the
// kernel's static shared memory well under the 48 KiB default limit).
inline constexpr int kVqEncodeMaxRow = 8192;

/// One layer's vq-page sides; passed by value to the kernel.
struct VqEncodeTables {
  int head_dim = 0, n_kv_heads = 0;
  int kind[2] = {0, 0};        // packed::VqSideKind per side (0 none, 1 vq, 2 fp16)
  int n_groups[2] = {0, 0};    // G
  int bits[2] = {0, 0};        // index width
  int group_size[2] = {0, 0};  // g = head_dim / G
  int shared[2] = {0, 0};      // 1: one fp16 scale per token per side
  int64_t scale_offset[2] = {0, 0};
  int64_t seg_offset[2] = {0, 0};  // segment of KV head h: h·head_bytes + seg_offset[s]
  int64_t head_bytes = 0;
  int64_t page_bytes = 0;
  const float* codebooks = nullptr;  // C per (h, side) at cb_offset[h·2 + side]
  const int64_t* cb_offset = nullptr;
  const float* channel_scale = nullptr;  // a per (h, side) at (h·2 + side)·head_dim
  const int32_t* channels = nullptr;     // (G, g) per (h, side) at (h·2 + side)·head_dim
  int* status = nullptr;                 // bit 0: a shared scale was not a finite fp16 value
};

}  // namespace ratekv::cuda::detail

namespace ratekv::cuda {
struct VqEncodePlan::Device {
  ~Device();  // frees what was uploaded (also when the plan's constructor throws)
  detail::VqEncodeTables t;
  float* codebooks = nullptr;
  float* channel_scale = nullptr;
  int32_t* channels = nullptr;
  int64_t* cb_offset = nullptr;
  int* status = nullptr;
};
}  // namespace ratekv::cuda
