// GPUBOX_CUDA_TRY(call): every CUDA runtime status is checked (CUDA backend only).
#pragma once

#include "common/error.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include <cuda_runtime_api.h>

#define GPUBOX_CUDA_TRY(call)                                         \
  do {                                                                \
    cudaError_t _gpubox_err = (call);                                 \
    if (_gpubox_err != cudaSuccess) {                                 \
      GPUBOX_FAIL("CUDA error ", cudaGetErrorName(_gpubox_err), " (", \
                  cudaGetErrorString(_gpubox_err), ") in ", #call);   \
    }                                                                 \
  } while (0)
#else
// The cpu backend has no CUDA calls; the macro still evaluates its argument.
#define GPUBOX_CUDA_TRY(call) (void)(call)
#endif
