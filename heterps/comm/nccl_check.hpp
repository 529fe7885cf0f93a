// GPUBOX_NCCL_TRY(call): every ncclResult_t is checked (cuda backend only).
#pragma once

#include <nccl.h>

#include "common/error.hpp"

#define GPUBOX_NCCL_TRY(call)                                                                  \
  do {                                                                                         \
    ncclResult_t _gpubox_nccl_result = (call);                                                 \
    if (_gpubox_nccl_result != ncclSuccess) {                                                  \
      GPUBOX_FAIL("NCCL error ", ncclGetErrorString(_gpubox_nccl_result), " in ", #call, ": ", \
                  ncclGetLastError(nullptr));                                                  \
    }                                                                                          \
  } while (0)
