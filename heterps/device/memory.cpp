#include "heterps/device/memory.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#if !defined(GPUBOX_BACKEND_CUDA)
#include <sys/mman.h>
#endif

#include "common/out_of_memory.hpp"
#include "heterps/device/counters.hpp"
#include "heterps/device/cuda_check.hpp"
#include "heterps/device/deferred.hpp"
#include "heterps/device/memory_registry.hpp"

namespace gpubox::device {
namespace {
#if !defined(GPUBOX_BACKEND_CUDA)
constexpr std::size_t kAlignment = 64;
std::size_t round_up(std::size_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

// Pages::kHuge blocks (memory.hpp) of at least one huge page are mapped on their own, starting on
// a 2 MiB boundary, with MADV_HUGEPAGE over the whole block: the kernel backs only whole 2 MiB
// spans inside a mapping with huge pages, so the tail past the last one keeps small pages and no
// block holds more memory than it asked for, and the block stays one mapping (advising the
// whole spans only split each block in two, and a process may hold only vm.max_map_count
// mappings). With THP off (or "never") the advice changes nothing.
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kSmallPage = 4096;
std::size_t round_up_to(std::size_t bytes, std::size_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

void* map_huge(std::size_t bytes) {
  const std::size_t length = round_up_to(bytes, kSmallPage);
  // Over-map by 2 MiB less a page, then give back the head and tail around the aligned block.
  const std::size_t span = length + kHugePage - kSmallPage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up_to(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const std::uintptr_t end = aligned + length;
  if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
  void* block = reinterpret_cast<void*>(aligned);
  madvise(block, length, MADV_HUGEPAGE);  // advice only: its failure changes nothing
  return block;
}

bool maps_huge(std::size_t bytes, Pages pages) {
  return pages == Pages::kHuge && bytes >= kHugePage;
}
void* allocate_host_block(std::size_t bytes, Pages pages) {
  return maps_huge(bytes, pages) ? map_huge(bytes)
                                 : std::aligned_alloc(kAlignment, round_up(bytes));
}
void free_host_block(void* ptr, std::size_t bytes, Pages pages) {
  if (maps_huge(bytes, pages)) {
    munmap(ptr, round_up_to(bytes, kSmallPage));
  } else {
    std::free(ptr);
  }
}
#endif

// Device check of one side of a copy or memset that is card memory: inside one allocation.
void check_inside(const MemoryRange& range, const void* ptr, std::size_t bytes, const char* role) {
  check_card_range(ptr, bytes, range.device, "copy", role);
}

// Counts (and, in check mode, checks) a copy on `stream`'s card.
void account_copy(void* dst, const void* src, std::size_t bytes, const Stream& stream) {
  CardCounters* counters = stream.counters();
  const bool check = device_check_enabled();
  if (counters == nullptr && !check) return;
  const MemoryRange to = find_memory(dst);
  const MemoryRange from = find_memory(src);
  const bool to_card = to.kind == MemoryKind::kCard;
  const bool from_card = from.kind == MemoryKind::kCard;
  if (check) {
    if (to_card) check_inside(to, dst, bytes, "destination");
    if (from_card) check_inside(from, src, bytes, "source");
    const int card = stream.device();
    if (to_card != from_card) {
      const MemoryRange& card_side = to_card ? to : from;
      if (card_side.device != card) {
        GPUBOX_FAIL("GPUBOX_DEVICE_CHECK: a host<->card copy of ", bytes, " bytes on card ", card,
                    "'s stream reaches ", describe(card_side), ", not card ", card);
      }
    } else if (to_card && to.device != card && from.device != card) {
      GPUBOX_FAIL("GPUBOX_DEVICE_CHECK: a copy on card ", card, "'s stream from ", describe(from),
                  " to ", describe(to), " touches none of card ", card,
                  "'s memory (enqueue it on the stream of a card that owns one of the buffers)");
    }
  }
  if (counters == nullptr) return;
  if (stream.role() == StreamRole::kCopy) counters->add_copy_stream_copy();
  if (to_card && from_card) {
    counters->add_card_copy();
  } else if (!to_card && !from_card) {
    counters->add_host_copy();
  } else if ((to_card ? from.kind : to.kind) == MemoryKind::kPinned) {
    counters->add_pinned_copy();
  } else {
    counters->add_pageable_copy();
  }
}

// A captured step copies only between card and pinned memory: a pageable copy is staged by
// the driver and blocks the calling thread (device rule 2), and CUDA refuses it in a capture.
void refuse_pageable_capture(const void* dst, const void* src, std::size_t bytes,
                             const Stream& stream) {
  const MemoryKind to = find_memory(dst).kind;
  const MemoryKind from = find_memory(src).kind;
  const auto pageable = [](MemoryKind kind) {
    return kind != MemoryKind::kCard && kind != MemoryKind::kPinned;
  };
  if (pageable(to) || pageable(from)) {
    const std::string what = ::gpubox::detail::concat("copy_bytes_async of ", bytes, " bytes ",
                                                      pageable(from) ? "from" : "to",
                                                      " pageable host memory (a pageable copy)");
    detail::refuse_while_capturing(what.c_str(), &stream);
  }
}

#if !defined(GPUBOX_BACKEND_CUDA)
// GPUBOX_DEVICE_CHECK=defer (deferred.hpp), outside a capture: a copy between card and pinned
// memory waits in the stream's queue; one that reads pageable memory takes its source now (CUDA
// stages it before cudaMemcpyAsync returns); one that writes pageable memory runs now, after the
// stream's earlier work (CUDA returns once it is done).
void deferred_copy(void* dst, const void* src, std::size_t bytes, const Stream& stream) {
  const auto pageable = [](const void* ptr) {
    const MemoryKind kind = find_memory(ptr).kind;
    return kind != MemoryKind::kCard && kind != MemoryKind::kPinned;
  };
  if (pageable(dst)) {
    detail::run_deferred(stream);
    std::memmove(dst, src, bytes);
  } else if (pageable(src)) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    stream.record("copy_bytes_async (from pageable memory)",
                  [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    stream.record("copy_bytes_async", [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
}
#endif

}  // namespace

void* CardMemory::allocate(std::size_t bytes, const Stream& stream, Pages pages) {
  if (bytes == 0) return nullptr;
  detail::refuse_while_capturing("CardMemory::allocate (a card allocation)", &stream);
  if (counters_ != nullptr) {
    const char* open_collective = counters_->add_allocation();
    if (open_collective != nullptr && device_check_enabled()) {
      GPUBOX_FAIL("GPUBOX_DEVICE_CHECK: card ", device_, " allocates ", bytes, " bytes after ",
                  open_collective,
                  " was enqueued and before the card synchronized (device rule 1 in "
                  "heterps/device/card.hpp: size every buffer before enqueueing a collective)");
    }
  }
  void* ptr = nullptr;
#if defined(GPUBOX_BACKEND_CUDA)
  (void)pages;  // the pool's card memory is on 2 MiB pages already
  DeviceGuard guard(device_);
  cudaError_t err = cudaMallocAsync(&ptr, bytes, stream.native());
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: cleared, so a later launch check does not report it
    throw OutOfMemory(::gpubox::detail::concat("card ", device_, ": cannot allocate ", bytes,
                                               " bytes (", cudaGetErrorString(err), "); in use ",
                                               bytes_in_use(), " bytes"));
  }
  if (err != cudaSuccess) {  // not a shortage (a lost context, a bad stream): an error as it is
    GPUBOX_FAIL("card ", device_, ": cannot allocate ", bytes, " bytes (", cudaGetErrorString(err),
                "); in use ", bytes_in_use(), " bytes");
  }
#else
  (void)stream;
  ptr = allocate_host_block(bytes, pages);
  if (ptr == nullptr) {
    throw OutOfMemory(::gpubox::detail::concat("card ", device_, ": cannot allocate ", bytes,
                                               " bytes of host memory; in use ", bytes_in_use(),
                                               " bytes"));
  }
#endif
  register_memory(ptr, bytes, MemoryKind::kCard, device_);
  std::size_t now = in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return ptr;
}

void CardMemory::deallocate(void* ptr, std::size_t bytes, const Stream& stream,
                            Pages pages) noexcept {
  if (ptr == nullptr) return;
  detail::note_while_capturing("CardMemory::deallocate (a card free)");
  unregister_memory(ptr);
  if (counters_ != nullptr) counters_->add_free();
#if defined(GPUBOX_BACKEND_CUDA)
  // On the owning device whatever the caller has current (teardown runs on the main thread).
  (void)pages;
  DeviceGuard guard(device_, std::nothrow);
  cudaFreeAsync(ptr, stream.native());
#else
  if (stream.deferred() != nullptr && stream.capturing() == nullptr &&
      !detail::deferred_idle(*stream.deferred())) {
    // GPUBOX_DEVICE_CHECK=defer: ordered on the stream as cudaFreeAsync is (work enqueued before
    // it may still read the block); on an idle stream, at once.
    // Never run at once here (the seeded coin): this function must not throw, and running the
    // queue would surface an earlier work's error.
    detail::defer(
        *stream.deferred(), "CardMemory::deallocate",
        [ptr, bytes, pages] { free_host_block(ptr, bytes, pages); }, /*may_run_now=*/false);
  } else {
    free_host_block(ptr, bytes, pages);
  }
#endif
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

void* allocate_pinned(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  detail::refuse_while_capturing("allocate_pinned (a pinned host allocation)");
  void* ptr = nullptr;
#if defined(GPUBOX_BACKEND_CUDA)
  const cudaError_t err = cudaMallocHost(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: cleared, as for card memory
    throw OutOfMemory(::gpubox::detail::concat(
        "cannot allocate ", bytes, " bytes of pinned host memory (", cudaGetErrorString(err), ")"));
  }
  GPUBOX_CUDA_TRY(err);  // not a shortage: an error as it is
#else
  ptr = std::aligned_alloc(kAlignment, round_up(bytes));
  if (ptr == nullptr) {
    throw OutOfMemory(
        ::gpubox::detail::concat("cannot allocate ", bytes, " bytes of pinned host memory"));
  }
#endif
  register_memory(ptr, bytes, MemoryKind::kPinned, -1);
  if (CardCounters* counters = thread_pinned_counters()) counters->add_pinned_allocation();
  return ptr;
}

void free_pinned(void* ptr) noexcept {
  if (ptr == nullptr) return;
  detail::note_while_capturing("free_pinned (a pinned host free)");
  unregister_memory(ptr);
  if (CardCounters* counters = thread_pinned_counters()) counters->add_pinned_free();
#if defined(GPUBOX_BACKEND_CUDA)
  cudaFreeHost(ptr);
#else
  // GPUBOX_DEVICE_CHECK=defer: cudaFreeHost waits for the whole device first (a failure of that
  // work cannot leave a noexcept free: it ends the process, as a failed stream teardown does).
  if (deferred_execution_enabled() && !detail::thread_capturing()) {
    try {
      detail::run_all_deferred();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "free_pinned: deferred work failed as the device was waited for: %s\n",
                   e.what());
      std::abort();
    }
  }
  std::free(ptr);
#endif
}

void copy_bytes_async(void* dst, const void* src, std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  if (stream.capturing() != nullptr) refuse_pageable_capture(dst, src, bytes, stream);
  account_copy(dst, src, bytes, stream);
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream.native()));
#else
  if (stream.deferred() != nullptr && stream.capturing() == nullptr) {
    deferred_copy(dst, src, bytes, stream);
    return;
  }
  enqueue(stream, "copy_bytes_async", [dst, src, bytes] { std::memmove(dst, src, bytes); });
#endif
}

void memset_bytes_async(void* dst, int value, std::size_t bytes, const Stream& stream) {
  if (bytes == 0) return;
  if (device_check_enabled())
    check_card_range(dst, bytes, stream.device(), "memset", "destination");
  if (CardCounters* counters = stream.counters()) counters->add_launches();
#if defined(GPUBOX_BACKEND_CUDA)
  GPUBOX_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, stream.native()));
#else
  enqueue(stream, "memset_bytes_async", [dst, value, bytes] { std::memset(dst, value, bytes); });
#endif
}

}  // namespace gpubox::device
