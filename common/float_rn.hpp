// Float operations rounded one at a time, to nearest even, on card and host alike: for the
// results both must agree on bit for bit (the accessor's show/click score, which decides which
// rows are created and evicted, on the card and on the cpu/parameter-server host). nvcc contracts
// a * b + c into one fused multiply-add by default (one rounding where the host rounds twice);
// its __fmul_rn / __fadd_rn are never contracted. On the host the operators are used as they
// are: the project builds all host code with -ffp-contract=off (the root CMakeLists.txt, which
// defines GPUBOX_FP_CONTRACT_OFF), whatever target a user's -march names. A host build of this
// header outside that, for a target with FMA (or with -ffast-math), stops below: g++ contracts
// across statements and inlined calls, so no spelling of the expression prevents it.
#pragma once

#include "common/macros.hpp"

// __FMA__ (x86 -mfma, -march=native), __FP_FAST_FMAF (g++; AArch64), __FAST_MATH__: a target or
// mode that can contract; GPUBOX_FP_CONTRACT_OFF: the build turned contraction off.
#if !defined(__CUDA_ARCH__) && !defined(GPUBOX_FP_CONTRACT_OFF) && \
    (defined(__FMA__) || defined(__FP_FAST_FMAF) || defined(__FAST_MATH__))
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
