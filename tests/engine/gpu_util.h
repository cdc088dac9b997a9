// tests/engine/gpu_util.h — device buffers and the GPU check for the engine tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace engine_test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// A device copy of a host vector (or `count` uninitialised elements).
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    if (p) cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

inline float bf16_to_f32(uint16_t u) {
  const uint32_t w = uint32_t{u} << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

/// ‖a − b‖ / ‖b‖ over n elements.
template <typename A, typename B>
double rel_l2(const A& a, const B& b, size_t off, size_t n) {
  double num = 0, den = 0;
  for (size_t i = off; i < off + n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace engine_test
