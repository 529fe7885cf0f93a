// The Thrust execution policy for a card's stream: thrust::cuda::par_nosync on CUDA (ordered on
// the stream; the caller synchronizes before reading results on the host), thrust::omp::par on
// the cpu backend (runs on the calling card's OpenMP threads).
#pragma once

#include <thrust/execution_policy.h>

#include "heterps/device/stream.hpp"

#if defined(GPUBOX_BACKEND_CUDA)
#include <thrust/system/cuda/execution_policy.h>
#else
#include <thrust/system/omp/execution_policy.h>
#endif

namespace gpubox::device {

inline auto exec_policy(const Stream& stream) {
#if defined(GPUBOX_BACKEND_CUDA)
  return thrust::cuda::par_nosync.on(stream.native());
#else
  (void)stream;
  return thrust::omp::par;
#endif
}

// The same policy, with Thrust's temporary storage taken from `allocator` (value_type char,
// allocate(std::ptrdiff_t), deallocate(char*, std::size_t); held by reference) instead of a
// malloc/free per algorithm call (on CUDA a cudaMalloc/cudaFree, which synchronize).
template <class Allocator>
auto exec_policy(const Stream& stream, Allocator& allocator) {
#if defined(GPUBOX_BACKEND_CUDA)
  return thrust::cuda::par_nosync(allocator).on(stream.native());
#else
  (void)stream;
  return thrust::omp::par(allocator);
#endif
}

}  // namespace gpubox::device
