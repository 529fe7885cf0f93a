#include "heterps/device/memory.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "heterps/device/cuda_check.hpp"

namespace gpubox::device {
#if !defined(GPUBOX_BACKEND_CUDA)
namespace {
constexpr std::size_t kAlignment = 64;
std::size_t round_up(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace
#endif

void* CardMemory::allocate(std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_CUDA_TRY(cudaSetDevice(device_));
  cudaError_t err = cudaMallocAsync(&ptr, bytes, stream.native());
  if (err != cudaSuccess) {
    GPUBOX_FAIL("card ", device_, ": cannot allocate ", bytes, " bytes (", cudaGetErrorString(err),
                "); in use ", bytes_in_use(), " bytes");
  }
#else
  (void)stream;
  ptr = std::aligned_alloc(kAlignment, round_up(bytes));
  if (ptr == nullptr) {
    GPUBOX_FAIL("card ", device_, ": cannot allocate ", bytes, " bytes of host memory; in use ",
                bytes_in_use(), " bytes");
  }
#endif
  std::size_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return ptr;
}

void CardMemory::deallocate(void* ptr, std::size_t bytes, const Stream& stream) noexcept {
  if (ptr == nullptr) return;
#if defined(GPUBOX_BACKEND_CUDA)
  cudaFreeAsync(ptr, stream.native());
#else
  (void)stream;
  std::free(ptr);
#endif
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

void* allocate_pinned(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_CUDA_TRY(cudaMallocHost(&ptr, bytes));
#else
  ptr = std::aligned_alloc(kAlignment, round_up(bytes));
  if (ptr == nullptr) GPUBOX_FAIL("cannot allocate ", bytes, " bytes of pinned host memory");
#endif
  return ptr;
}

void free_pinned(void* ptr) noexcept {
  if (ptr == nullptr) return;
#if defined(GPUBOX_BACKEND_CUDA)
  cudaFreeHost(ptr);
#else
  std::free(ptr);
#endif
}

void copy_bytes_async(void* dst, const void* src, std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream.native()));
#else
  (void)stream;
  std::memmove(dst, src, bytes);
#endif
}

void memset_bytes_async(void* dst, int value, std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, stream.native()));
#else
  (void)stream;
  std::memset(dst, value, bytes);
#endif
}

}  // namespace gpubox::device
