// src/cuda/cuda_check_host.h — RATEKV_CUDA_CHECK for the host-only .cpp files
// of the CUDA module (packed_plan.cpp, vq_plan.cpp): a failed CUDA runtime
// call becomes ratekv::Error naming the call, the CUDA error string and the
// source line. (.cu files use the nvcc-side twin in attention_common.cuh,
// which avoids fmt in device translation units.)
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "ratekv/common/error.h"

#define RATEKV_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    cudaError_t _e = (expr);                                                                 \
    if (_e != cudaSuccess)                                                                   \
      ::ratekv::fail("CUDA: {} failed: {} ({}:{})", #expr, cudaGetErrorString(_e), __FILE__, \
                     __LINE__);                                                              \
  } while (0)

namespace ratekv::cuda::detail {
/// Uploads v to a new device buffer (nullptr for an empty v) and adds its
/// bytes to `tally` (the plans' device_bytes()). Throws Error (RATEKV_CUDA_CHECK)
/// when cudaMalloc or the copy fails.
template <typename T>
T* upload(const std::vector<T>& v, size_t& tally) {
  T* d = nullptr;
  if (v.empty()) return nullptr;
  RATEKV_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  tally += v.size() * sizeof(T);
  RATEKV_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
}  // namespace ratekv::cuda::detail
