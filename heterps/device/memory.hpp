// Card memory: a per-card memory resource, an owning device buffer, a pinned host buffer, and
// stream-ordered copies. RAII only: every allocation is released by a destructor, so nothing
// leaks when a test assertion or an error unwinds the stack.
//
// Every allocation and copy goes through here, so here it is counted (counters.hpp) and, with
// GPUBOX_DEVICE_CHECK=1, checked (memory_registry.hpp). The rules these functions serve are in
// card.hpp ("Device rules").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/stream.hpp"

namespace gpubox::device {

// How a card block is paged. kHuge: a long-lived block read at random over its whole size (the
// hash table's slots, row pool pages): on the cpu backend a block of 2 MiB or more is mapped on
// its own on a 2 MiB boundary with transparent huge pages over its whole 2 MiB spans (with 4 KiB
// pages nearly every random access also missed the TLB), the tail on small pages. Not for blocks
// that come and go: each is then a fresh mapping the kernel zeroes. CUDA: the same either way
// (cudaMallocAsync's pool already maps card memory in 2 MiB pages).
enum class Pages : uint8_t { kSmall, kHuge };

// Allocates card memory and counts it. CUDA: stream-ordered (cudaMallocAsync) from `device`'s
// memory pool, under a DeviceGuard (the calling thread's current device is left as it was).
// cpu: 64-byte-aligned host memory standing in for the card's arena (Pages::kHuge blocks: see
// Pages). Every block is registered as card `device` memory (memory_registry.hpp).
// Thread-safe (the counters are atomic); owned by its Card and must outlive its buffers.
class CardMemory {
 public:
  // `counters` (may be null) receive the allocations; an allocation while a collective is in
  // flight on the card (device rule 1) is counted there and, with GPUBOX_DEVICE_CHECK, fatal.
  explicit CardMemory(int device, CardCounters* counters = nullptr)
      : device_(device), counters_(counters) {}
  CardMemory(const CardMemory&) = delete;
  CardMemory& operator=(const CardMemory&) = delete;

  void* allocate(std::size_t bytes, const Stream& stream, Pages pages = Pages::kSmall);
  // `bytes` and `pages` as allocated.
  void deallocate(void* ptr, std::size_t bytes, const Stream& stream,
                  Pages pages = Pages::kSmall) noexcept;

  int device() const { return device_; }
  std::size_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  std::size_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }

 private:
  int device_;
  CardCounters* counters_;
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
};

// Page-locked host memory for fast host<->card copies (plain aligned memory on cpu), registered
// as pinned so copies from and to it count as pinned on both backends. cudaMallocHost
// synchronizes the device: allocate pinned buffers at setup, never inside a step.
void* allocate_pinned(std::size_t bytes);
void free_pinned(void* ptr) noexcept;

// Any-direction copy ordered on `stream` (host<->card, card<->card; CUDA uses unified
// addressing). Counted on the stream's card as a pinned, pageable, card or host copy. With
// GPUBOX_DEVICE_CHECK each card side must lie inside one allocation, and a host<->card copy's
// card side must be the stream's card (a card<->card copy needs one side on it).
void copy_bytes_async(void* dst, const void* src, std::size_t bytes, const Stream& stream);
// Counted as a launch; checked like a copy's card side.
void memset_bytes_async(void* dst, int value, std::size_t bytes, const Stream& stream);

template <class T>
void copy_async(T* dst, const T* src, std::size_t count, const Stream& stream) {
  static_assert(std::is_trivially_copyable_v<T>);
  copy_bytes_async(dst, src, count * sizeof(T), stream);
}

// Owning, move-only array of `T` in one card's memory. `size()` elements are valid; capacity
// grows geometrically so per-step buffers stop allocating in steady state. Not thread-safe.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "card buffers hold trivially copyable data");

 public:
  device_buffer() = default;
  device_buffer(std::size_t count, CardMemory& memory, const Stream& stream,
                Pages pages = Pages::kSmall)
      : memory_(&memory), stream_(&stream), pages_(pages) {
    reserve(count);
    size_ = count;
  }
  ~device_buffer() { release(); }
  device_buffer(device_buffer&& other) noexcept { swap(other); }
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      release();
      swap(other);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  std::size_t bytes() const { return size_ * sizeof(T); }

  // Sets the size to `count`, keeping the first min(size, count) elements.
  void resize(std::size_t count) {
    reserve_impl(count, /*keep=*/true);
    size_ = count;
  }
  // Sets the size to `count` without keeping the contents (cheapest way to reuse a buffer).
  void resize_discard(std::size_t count) {
    reserve_impl(count, /*keep=*/false);
    size_ = count;
  }
  void reserve(std::size_t count) { reserve_impl(count, /*keep=*/true); }
  void clear() { size_ = 0; }
  // Frees the memory; the buffer stays usable (with the same memory and stream).
  void release() noexcept {
    if (data_ != nullptr) memory_->deallocate(data_, capacity_ * sizeof(T), *stream_, pages_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }
  const Stream& stream() const { return *stream_; }
  CardMemory* memory() const { return memory_; }

 private:
  void reserve_impl(std::size_t count, bool keep) {
    if (count <= capacity_) return;
    GPUBOX_EXPECTS(memory_ != nullptr, "device_buffer used before it was given a CardMemory");
    std::size_t new_capacity = capacity_ + capacity_ / 2;
    if (new_capacity < count) new_capacity = count;
    // Contents not kept: free first, so the old and the new block are never alive together
    // (stream-ordered on CUDA: the pool may hand the same memory back).
    if (!keep || size_ == 0) release();
    T* fresh = static_cast<T*>(memory_->allocate(new_capacity * sizeof(T), *stream_, pages_));
    if (data_ != nullptr) {
      copy_async(fresh, data_, size_, *stream_);
      memory_->deallocate(data_, capacity_ * sizeof(T), *stream_, pages_);
    }
    data_ = fresh;
    capacity_ = new_capacity;
  }
  void swap(device_buffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
    std::swap(memory_, other.memory_);
    std::swap(stream_, other.stream_);
    std::swap(pages_, other.pages_);
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  CardMemory* memory_ = nullptr;
  const Stream* stream_ = nullptr;
  Pages pages_ = Pages::kSmall;
};

// Owning, move-only pinned host array.
template <class T>
class pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t count)
      : data_(count ? static_cast<T*>(allocate_pinned(count * sizeof(T))) : nullptr),
        size_(count) {}
  ~pinned_buffer() { free_pinned(data_); }
  pinned_buffer(pinned_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& other) noexcept {
    if (this != &other) {
      free_pinned(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Synchronous helpers for tests and setup code (they synchronize `stream`; to_host's copy lands
// in pageable memory: per-step readbacks go through a pinned_buffer instead, device rule 2).
template <class T>
std::vector<T> to_host(const T* src, std::size_t count, const Stream& stream) {
  std::vector<T> out(count);
  if (count > 0) copy_async(out.data(), src, count, stream);
  stream.synchronize();
  return out;
}
template <class T>
std::vector<T> to_host(const device_buffer<T>& buffer) {
  return to_host(buffer.data(), buffer.size(), buffer.stream());
}
template <class T>
device_buffer<T> to_device(const std::vector<T>& host, CardMemory& memory, const Stream& stream) {
  device_buffer<T> out(host.size(), memory, stream);
  if (!host.empty()) copy_async(out.data(), host.data(), host.size(), stream);
  stream.synchronize();
  return out;
}

}  // namespace gpubox::device
