// tests/engine/gpu_util.h — what the engine tests add to tests/support/cuda_test.h (its DevBuf as Dev,
// have_gpu): bf16 decoding and the relative L2 error.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "../support/cuda_test.h"

namespace engine_test {

using ratekv_test::have_gpu;

/// A device array owned by the test (tests/support/cuda_test.h's DevBuf).
template <typename T>
using Dev = ratekv_test::DevBuf<T>;

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
