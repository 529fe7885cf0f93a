// RowPool: fixed-stride float rows in one card's memory, addressed by index, with a free list.
//
// Allocation is a bulk, host-driven step that needs no atomics in kernels: before a batch the
// caller reserves `count` free rows and reads them as *candidates* (peek_free); a kernel takes
// candidate i for batch position i when it needs a row and marks used[i]; commit_allocation
// then returns the untaken candidates to the free list with one stable compaction. The same
// code runs on the GPU (no contended counter) and on the cpu backend (no shared cache line
// bouncing between the card's threads), and which row a batch position gets is deterministic.
//
// Growth keeps indices: rows [0, capacity) keep their index and contents when capacity grows,
// but the base pointer rows() changes, so device refs must be taken again after any call that
// may grow the pool. Not thread-safe: one card thread drives a pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/sparse/sparse_types.hpp"

namespace gpubox::sparse {

class RowPool {
 public:
  // `stride`: floats per row (0: an index allocator with no row storage). `initial_rows` rows
  // are allocated up front, all free. The card must outlive the pool.
  RowPool(device::Card& card, int32_t stride, std::size_t initial_rows = 0);
  RowPool(RowPool&&) noexcept = default;
  RowPool& operator=(RowPool&&) noexcept = default;
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  int32_t stride() const { return stride_; }
  // Rows allocated (free or in use); valid indices are [0, capacity()).
  std::size_t capacity() const { return capacity_; }
  std::size_t free_count() const { return free_count_; }
  std::size_t in_use() const { return capacity_ - free_count_; }
  // Row r starts at rows() + r * stride() (card memory). Invalidated by growth.
  float* rows() { return rows_.data(); }
  const float* rows() const { return rows_.data(); }
  // Card bytes held: row storage plus the free list.
  std::size_t memory_bytes() const;

  // Grows (geometrically, at least to the need) until at least `count` rows are free. New rows
  // are zero-filled. Stream-ordered.
  void reserve_free(std::size_t count, const device::Stream& stream);
  // The `count` candidates of the next batch allocation (card memory), valid until the next
  // call that changes the pool. Requires free_count() >= count.
  const row_index_t* peek_free(std::size_t count) const;
  // Ends a batch allocation started by peek_free(count): candidate i is taken when used[i] != 0
  // (`used` in card memory); the others go back to the free list. Returns how many were taken.
  // Synchronizes `stream`.
  std::size_t commit_allocation(const uint8_t* used, std::size_t count,
                                const device::Stream& stream);
  // Takes `count` rows at once (reserving them first), writing their indices to `out` (card
  // memory). Stream-ordered.
  void allocate(row_index_t* out, std::size_t count, const device::Stream& stream);
  // Returns rows to the free list; entries equal to kInvalidRow are skipped. The rows must be
  // in use and distinct (the hash table guarantees both). Returns how many were freed.
  // Synchronizes `stream`.
  std::size_t release(const row_index_t* rows, std::size_t count, const device::Stream& stream);
  // Every row free again (capacity and contents kept). Stream-ordered.
  void clear(const device::Stream& stream);

 private:
  void grow_to(std::size_t new_capacity, const device::Stream& stream);

  device::Card* card_;
  int32_t stride_;
  std::size_t capacity_ = 0;
  std::size_t free_count_ = 0;
  device::device_buffer<float> rows_;
  // free_[0, free_count_) are the free rows; a batch takes candidates from the top.
  device::device_buffer<row_index_t> free_;
};

}  // namespace gpubox::sparse
