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

// Before a loop whose iterations are independent lanes (each writes its own value, in its own
// order): the cpu compiler vectorizes it across them (each lane's operations and their order
// unchanged, so the same bits), where its cost model would build vectors from scalars. nvcc, or
// a build without OpenMP: nothing (a thread is one lane).
#if defined(__CUDACC__) || !defined(_OPENMP)
#define GPUBOX_LANES
#else
#define GPUBOX_LANES _Pragma("omp simd")
#endif

#if defined(__CUDA_ARCH__)
#define GPUBOX_ON_DEVICE 1
#else
#define GPUBOX_ON_DEVICE 0
#endif
