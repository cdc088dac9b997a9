// tests/support/cuda_test.h — what the GPU tests share (tests/cuda): CK(call)
// asserts a CUDA runtime call succeeded, have_gpu() says whether a device is
// visible (tests skip without one), DevBuf<T> is a device array owned by the
// test, fp16_queries() gives a query batch in both dtypes the kernels read.
// Header-only; host code (cuda_runtime.h), compiled by the C++ compiler.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ratekv/common/fp16.h"
#include "ratekv/cuda/decode_attention.h"

/// ASSERT that a CUDA runtime call returned cudaSuccess, naming the call.
#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace ratekv_test {

/// The fp16 copy of the queries q (any layout, one float per element) that the
/// kernels read with q_dtype f16; with f16, q itself is rounded to those fp16
/// values, so the fp32 CPU reference sees exactly what the kernel does.
inline std::vector<uint16_t> fp16_queries(std::vector<float>& q, ratekv::cuda::DType q_dtype) {
  std::vector<uint16_t> q16(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q16[i] = ratekv::fp32_to_fp16(q[i]);
    if (q_dtype == ratekv::cuda::DType::f16) q[i] = ratekv::fp16_to_fp32(q16[i]);
  }
  return q16;
}

/// True when at least one CUDA device is visible.
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// n elements of T in device memory (at least one element is allocated, so a
/// zero-length buffer still has a valid pointer); p is null when cudaMalloc
/// failed (the test's CK on its first use reports it). Freed on destruction.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  /// A copy of the host vector v.
  DevBuf(const std::vector<T>& v) : DevBuf(v.size()) {
    if (p) cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  /// The n elements, copied back to the host.
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

}  // namespace ratekv_test
