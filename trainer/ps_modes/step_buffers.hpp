// Host buffers a PS training thread reuses step after step (PsWorker: the batch's keys, its pull
// records, the dense table's copies). Each is sized through a BufferGrowth, which lets it grow
// only when a step needs more than any step before (geometrically, as std::vector and
// pinned_buffer below do) and counts every growth: the steady step grows nothing, and the tests
// pin that count at 0 (as the gpubox mode pins its card allocations per step).
//
// Thread-safety: one thread (the buffers' owner).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "heterps/device/memory.hpp"

namespace gpubox::trainer::ps_modes {

class BufferGrowth {
 public:
  // Makes *buffer hold n elements (the first min(size, n) kept), growing it only past its
  // capacity (counted).
  template <class T>
  void resize(std::vector<T>* buffer, std::size_t n) {
    reserve(buffer, n);
    buffer->resize(n);
  }
  // Room for n elements without a reallocation (counted when it must grow).
  template <class T>
  void reserve(std::vector<T>* buffer, std::size_t n) {
    if (n <= buffer->capacity()) return;
    ++growths_;
    buffer->reserve(std::max(n, buffer->capacity() + buffer->capacity() / 2));
  }
  // A pinned buffer of at least n elements, contents not kept (a growth is also a pinned
  // allocation on the calling thread's card: device::DeviceCounts).
  template <class T>
  void fit(device::pinned_buffer<T>* buffer, std::size_t n) {
    if (n <= buffer->size()) return;
    ++growths_;
    *buffer = device::pinned_buffer<T>(std::max(n, buffer->size() + buffer->size() / 2));
  }
  // Growths so far.
  uint64_t growths() const { return growths_; }

 private:
  uint64_t growths_ = 0;
};

}  // namespace gpubox::trainer::ps_modes
