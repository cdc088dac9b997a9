// tests/support/cuda_test.h — what the GPU tests share (tests/cuda): CK(call)
// asserts a CUDA runtime call succeeded, have_gpu() says whether a device is
// visible (tests skip without one), DevBuf<T> is a device array owned by the
// test. Header-only; host code (cuda_runtime.h), compiled by the C++ compiler.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

/// ASSERT that a CUDA runtime call returned cudaSuccess, naming the call.
#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace ratekv_test {

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
