// src/cuda/cuda_check_host.h — RATEKV_CUDA_CHECK for the host-only .cpp files
// of the CUDA module (packed_plan.cpp, vq_plan.cpp): a failed CUDA runtime
// call becomes ratekv::Error naming the call, the CUDA error string and the
// source line. (.cu files use the nvcc-side twin in attention_common.cuh,
// which avoids fmt in device translation units.)
#pragma once

#include <cuda_runtime.h>

#include "ratekv/common/error.h"

#define RATEKV_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    cudaError_t _e = (expr);                                                                 \
    if (_e != cudaSuccess)                                                                   \
      ::ratekv::fail("CUDA: {} failed: {} ({}:{})", #expr, cudaGetErrorString(_e), __FILE__, \
                     __LINE__);                                                              \
  } while (0)
