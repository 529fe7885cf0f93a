// Portable function qualifiers: the same source builds with nvcc (CUDA backend) and with the
// host compiler (cpu backend, Thrust's OMP device system).
#pragma once

#if defined(__CUDACC__)
#define GPUBOX_HD __host__ __device__
#define GPUBOX_DEVICE __device__
#define GPUBOX_FORCEINLINE __forceinline__
#else
#define GPUBOX_HD
#define GPUBOX_DEVICE
#define GPUBOX_FORCEINLINE inline __attribute__((always_inline))
#endif

#if defined(__CUDA_ARCH__)
#define GPUBOX_ON_DEVICE 1
#else
#define GPUBOX_ON_DEVICE 0
#endif
