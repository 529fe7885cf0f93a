// ScratchArena: Thrust's temporary storage (sort and scan buffers) from one card's memory, reused
// across calls. Every Card owns one and binds it to its stream, so every Thrust call made through
// device::exec_policy takes its temporaries from here: in steady state a step allocates nothing.
// Without it every Thrust algorithm would malloc/free its temporaries (cudaMalloc/cudaFree on
// CUDA, which also synchronize the device: device rule 1 and 4 in card.hpp).
//
// A bump arena: allocations are carved from one buffer and released all together when the last
// one is returned (Thrust returns them before the algorithm call ends). A request that does not
// fit is served by a one-off card allocation, and the arena grows to the peak demand once it is
// idle, so later calls of the same size fit. reserve() grows it ahead of a step whose Thrust
// calls run while a collective is in flight (where an allocation would break rule 1). Reuse is
// stream-ordered: every user of the arena runs on the card's stream. Satisfies Thrust's
// allocator requirements (value_type char). Not thread-safe: one card thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::device {

class ScratchArena {
 public:
  using value_type = char;

  // `memory` and `stream` (the card's) must outlive the arena. Allocates nothing yet.
  ScratchArena(CardMemory& memory, const Stream& stream)
      : memory_(&memory), stream_(&stream), arena_(0, memory, stream) {}
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;
  ~ScratchArena() {
    for (auto& [ptr, bytes] : overflow_) memory_->deallocate(ptr, bytes, *stream_);
  }

  char* allocate(std::ptrdiff_t requested) {
    GPUBOX_EXPECTS(requested >= 0, "negative scratch request ", requested);
    detail::refuse_while_capturing("ScratchArena::allocate (Thrust temporaries)", stream_);
    const std::size_t bytes = round_up(static_cast<std::size_t>(requested));
    ++live_;
    peak_ = std::max(peak_, used_ + bytes);
    if (used_ + bytes <= arena_.size()) {
      char* out = arena_.data() + used_;
      used_ += bytes;
      return out;
    }
    used_ += bytes;  // counted, so the arena grows to the whole demand
    ++overflow_allocations_;
    ++card_allocations_;
    char* out = static_cast<char*>(memory_->allocate(bytes, *stream_));
    overflow_.emplace_back(out, bytes);
    return out;
  }

  void deallocate(char* ptr, std::size_t /*bytes*/) {
    for (std::size_t i = 0; i < overflow_.size(); ++i) {
      if (overflow_[i].first == ptr) {
        memory_->deallocate(ptr, overflow_[i].second, *stream_);
        ++card_frees_;
        overflow_[i] = overflow_.back();
        overflow_.pop_back();
        break;
      }
    }
    if (--live_ == 0) {
      used_ = 0;
      grow_to_peak();
    }
  }

  // Grows the arena (now, when idle; else once idle) so that `bytes` of temporaries fit without
  // an allocation. The caller picks the moment: before enqueueing a collective (rule 1).
  void reserve(std::size_t bytes) {
    peak_ = std::max(peak_, round_up(bytes));
    if (live_ == 0) grow_to_peak();
  }

  // One-off allocations so far (they stop once the arena has grown to the steady demand).
  std::size_t overflow_allocations() const { return overflow_allocations_; }
  std::size_t bytes() const { return arena_.size(); }
  // The largest demand seen (or reserved) so far.
  std::size_t peak() const { return peak_; }
  // The card allocations and frees the arena made: its one-offs and its own growth. Thrust's
  // demand differs by backend (CUB's tile states on CUDA, generic flag arrays on OpenMP), so a
  // test that counts a card's allocations subtracts these to compare the two backends.
  std::size_t card_allocations() const { return card_allocations_; }
  std::size_t card_frees() const { return card_frees_; }

 private:
  static std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

  void grow_to_peak() {
    if (peak_ <= arena_.size()) return;
    const std::size_t capacity = arena_.capacity();
    arena_.resize_discard(peak_);
    if (arena_.capacity() == capacity) return;  // it fitted the block it had
    ++card_allocations_;
    if (capacity > 0) ++card_frees_;
  }

  CardMemory* memory_;
  const Stream* stream_;
  device_buffer<char> arena_;
  std::vector<std::pair<char*, std::size_t>> overflow_;
  std::size_t used_ = 0;
  std::size_t peak_ = 0;
  std::size_t live_ = 0;
  std::size_t overflow_allocations_ = 0;
  std::size_t card_allocations_ = 0;
  std::size_t card_frees_ = 0;
};

}  // namespace gpubox::device
