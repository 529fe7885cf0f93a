// GPUBOX_CUDA_TRY(call): every CUDA runtime status is checked (CUDA backend only). A shortage
// (cudaErrorMemoryAllocation: of card memory, or of the host memory or address space the runtime
// maps, as when it starts under `ulimit -v`) is an OutOfMemory, so that the binaries answer it
// naming what the config asked for (common/out_of_memory.hpp); every other status an Error.
#pragma once

#include "common/error.hpp"
#include "common/out_of_memory.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include <cuda_runtime_api.h>

#define GPUBOX_CUDA_TRY(call)                                                          \
  do {                                                                                 \
    cudaError_t _gpubox_err = (call);                                                  \
    if (_gpubox_err == cudaErrorMemoryAllocation) {                                    \
      (void)cudaGetLastError(); /* not sticky: cleared for the next launch check */    \
      throw ::gpubox::OutOfMemory(                                                     \
          ::gpubox::detail::concat("CUDA error ", cudaGetErrorName(_gpubox_err), " (", \
                                   cudaGetErrorString(_gpubox_err), ") in ", #call));  \
    }                                                                                  \
    if (_gpubox_err != cudaSuccess) {                                                  \
      GPUBOX_FAIL("CUDA error ", cudaGetErrorName(_gpubox_err), " (",                  \
                  cudaGetErrorString(_gpubox_err), ") in ", #call);                    \
    }                                                                                  \
  } while (0)
#else
// The cpu backend has no CUDA calls; the macro still evaluates its argument.
#define GPUBOX_CUDA_TRY(call) (void)(call)
#endif
