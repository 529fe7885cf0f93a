// Float operations rounded one at a time, to nearest even, on card and host alike: for the
// results both must agree on bit for bit (the accessor's show/click score, which decides which
// rows are created and evicted, on the card and on the cpu/parameter-server host). nvcc contracts
// a * b + c into one fused multiply-add by default (one rounding where the host rounds twice);
// its __fmul_rn / __fadd_rn are never contracted. On the host the operators are used as they
// are: GPUBox's host build targets the x86-64 baseline, which has no FMA to contract into, and
// the sources built for FMA targets (gpubox_no_fp_contract, cmake/GpuboxBackend.cmake) build
// without contraction. A host build for an FMA target without that stops below: g++ contracts
// across statements and inlined calls, so no spelling of the expression prevents it.
#pragma once

#include "common/macros.hpp"

// __FP_FAST_FMAF: the target has FMA (g++, clang: -mfma, -march=native); GPUBOX_FP_CONTRACT_OFF:
// the build says it turned contraction off (gpubox_no_fp_contract defines it).
#if !defined(__CUDA_ARCH__) && defined(__FP_FAST_FMAF) && !defined(GPUBOX_FP_CONTRACT_OFF)
#error "float_rn.hpp: a host build for FMA needs -ffp-contract=off -DGPUBOX_FP_CONTRACT_OFF=1"
#endif

namespace gpubox {

GPUBOX_HD GPUBOX_FORCEINLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

GPUBOX_HD GPUBOX_FORCEINLINE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

GPUBOX_HD GPUBOX_FORCEINLINE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

}  // namespace gpubox
