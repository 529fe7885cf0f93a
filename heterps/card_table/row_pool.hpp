// RowPool: fixed-stride float rows in one card's memory, addressed by index, with a free list.
//
// Rows live in fixed-size pages (page_rows() rows each, a power of two) reached through a small
// page table: row r is row (r & (page_rows - 1)) of page r >> log2(page_rows). Growth adds pages
// and never moves a row, so the pool never holds two copies of itself (a flat array that doubles
// would hold old + new, ~2.5x the rows, at the moment the card is fullest). An index means the
// same on host and card and stays valid for the pool's life.
//
// Allocation is a bulk, host-driven step that needs no atomics in kernels: before a batch the
// caller reserves `count` free rows and reads them as *candidates* (peek_free); a kernel takes
// candidate i for batch position i when it needs a row and marks used[i]; commit_allocation
// then returns the untaken candidates to the free list with one stable compaction. The same
// code runs on the GPU (no contended counter) and on the cpu backend (no shared cache line
// bouncing between the card's threads), and which row a batch position gets is deterministic.
// Released rows go back to the free list and are reused before any new page is added.
//
// Device views (rows()) hold the page table's address, which moves when the table grows: take a
// fresh view after any call that may grow the pool. Not thread-safe: one card thread drives a
// pool. Move-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/macros.hpp"
#include "heterps/card_table/sparse_types.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::card_table {

// Device view of a pool's rows. Trivially copyable.
struct RowPagesRef {
  float* const* pages = nullptr;
  uint32_t page_shift = 0;                   // log2(rows per page)
  int32_t stride = 0;                        // floats per row
  row_index_t index_mask = ~row_index_t{0};  // a handle's index bits (RowHandleCodec)

  GPUBOX_HD float* row(row_index_t handle) const {
    const row_index_t r = handle & index_mask;
    const row_index_t within = r & ((row_index_t{1} << page_shift) - 1);
    return pages[r >> page_shift] +
           static_cast<std::size_t>(within) * static_cast<std::size_t>(stride);
  }
  // Hint that row `handle` is read (kWrite: updated) soon. cpu backend: prefetches the row's
  // cache lines, so a loop over rows at random (a step's pull records, its optimizer updates)
  // overlaps their misses instead of waiting for each; on the card, nothing (warps hide it).
  template <bool kWrite = false>
  GPUBOX_HD GPUBOX_FORCEINLINE void prefetch(row_index_t handle) const {
#if !GPUBOX_ON_DEVICE
    if (handle == kInvalidRow) return;  // row() would read past the page table
    const char* first = reinterpret_cast<const char*>(row(handle));
    const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(stride);
    for (std::size_t at = 0; at < bytes; at += 64) __builtin_prefetch(first + at, kWrite ? 1 : 0);
    if (bytes > 0) __builtin_prefetch(first + bytes - 1, kWrite ? 1 : 0);  // a row's last line
#else
    (void)handle;
#endif
  }
};

// Device view of the rows of several pools (one per width class), reached by handle: the
// handle's class bits pick the pool. Trivially copyable.
struct RowPoolsRef {
  RowPagesRef pools[kMaxRowPools] = {};
  RowHandleCodec codec;

  // One pool (no class bits) reads pools[0] directly: the common case keeps its fields in
  // registers instead of indexing the array per row.
  GPUBOX_HD const RowPagesRef& pool_of(row_index_t handle) const {
    return codec.index_bits == 32 ? pools[0] : pools[codec.pool_of(handle)];
  }
  GPUBOX_HD float* row(row_index_t handle) const { return pool_of(handle).row(handle); }
  template <bool kWrite = false>
  GPUBOX_HD GPUBOX_FORCEINLINE void prefetch(row_index_t handle) const {
    if (handle != kInvalidRow) pool_of(handle).template prefetch<kWrite>(handle);
  }
  GPUBOX_HD int32_t stride(row_index_t handle) const { return pool_of(handle).stride; }
};

class RowPool {
 public:
  // `stride`: floats per row (0: an index allocator with no row storage). `initial_rows` rows
  // (rounded up to whole pages) are allocated up front, all free. `page_rows`: rows per page, a
  // power of two (0: page_rows_for(stride)). With `codec`, the pool is pool `pool` of a set: its
  // rows are named by handles (RowHandleCodec), at most codec.max_rows() of them; by default a
  // handle is the index. The card must outlive the pool.
  RowPool(device::Card& card, int32_t stride, std::size_t initial_rows = 0,
          std::size_t page_rows = 0, RowHandleCodec codec = {}, int32_t pool = 0);
  RowPool(RowPool&&) noexcept = default;
  RowPool& operator=(RowPool&&) noexcept = default;
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  int32_t stride() const { return stride_; }
  // Rows allocated (free or in use), a multiple of page_rows(); valid indices are [0, capacity()).
  std::size_t capacity() const { return capacity_; }
  std::size_t free_count() const { return free_count_; }
  std::size_t in_use() const { return capacity_ - free_count_; }
  std::size_t page_rows() const { return std::size_t{1} << page_shift_; }
  std::size_t page_bytes() const { return page_rows() * row_bytes(); }
  std::size_t pages() const { return pages_.size(); }
  std::size_t row_bytes() const { return sizeof(float) * static_cast<std::size_t>(stride_); }
  // The rows (card memory). Invalidated by growth.
  RowPagesRef rows() const {
    return RowPagesRef{page_table_.data(), page_shift_, stride_, codec_.index_mask()};
  }
  int32_t pool_id() const { return pool_; }
  // Card bytes held: pages, page table and free list.
  std::size_t memory_bytes() const;

  // Grows (by whole pages, to the need) until at least `count` rows are free. New rows are
  // zero-filled. Stream-ordered.
  void reserve_free(std::size_t count, const device::Stream& stream);
  // Sizes the free list for `rows` rows up front (no page is allocated), so that growing to that
  // many rows never reallocates it: a card budget plans its index memory once.
  void reserve_index(std::size_t rows);
  // The `count` candidates of the next batch allocation (card memory), valid until the next
  // call that changes the pool. Requires free_count() >= count.
  const row_index_t* peek_free(std::size_t count) const;
  // Ends a batch allocation started by peek_free(count): candidate i is taken when used[i] != 0
  // (`used` in card memory); the others go back to the free list. Returns how many were taken.
  // Synchronizes `stream`.
  std::size_t commit_allocation(const uint8_t* used, std::size_t count,
                                const device::Stream& stream);
  // Ends a batch allocation started by peek_free(count) in which every candidate was taken
  // (keys known to be new): no flags to count, no card work.
  void take_free(std::size_t count);
  // Takes `count` rows at once (reserving them first), writing their indices to `out` (card
  // memory). Stream-ordered.
  void allocate(row_index_t* out, std::size_t count, const device::Stream& stream);
  // Returns rows to the free list; entries equal to kInvalidRow, and handles of other pools,
  // are skipped. The rows must be in use and distinct (the hash table guarantees both). Returns
  // how many were freed.
  // Synchronizes `stream`.
  std::size_t release(const row_index_t* rows, std::size_t count, const device::Stream& stream);
  // release() of `count` rows known to be in use and distinct, without its count: returns where
  // they go on the free list (card memory), for the caller's kernel to write them there in
  // order, and counts them free from now on. Requires count <= in_use(). No card work.
  row_index_t* append_free(std::size_t count);
  // Every row free again (capacity and contents kept). Stream-ordered.
  void clear(const device::Stream& stream);
  // Shrinking (CardSparseStore::compact_pool moves the rows above `first_row` below it first):
  // takes the free rows at or above `first_row` off the free list, so that no allocation hands
  // them out; returns how many. Synchronizes.
  std::size_t withhold_free_from(std::size_t first_row, const device::Stream& stream);
  // Drops the pages at and above row `rows` (a multiple of page_rows()); every row there must be
  // free and withheld. Stream-ordered: the pages are freed on the card's stream after its work
  // (on another `stream`, after a wait for it).
  void drop_pages_from(std::size_t rows, const device::Stream& stream);

  // out[i * stride + f] = field f of row rows[i], i < n (card memory). One thread per (row,
  // field): coalesced. Stream-ordered.
  void gather(const row_index_t* rows, std::size_t n, float* out,
              const device::Stream& stream) const;
  // Field f of row rows[i] = src[i * stride + f]; the rows must be distinct. Stream-ordered.
  void scatter(const float* src, const row_index_t* rows, std::size_t n,
               const device::Stream& stream);

 private:
  void add_pages(std::size_t count, const device::Stream& stream);

  device::Card* card_;
  int32_t stride_;
  RowHandleCodec codec_;
  int32_t pool_;
  uint32_t page_shift_;
  std::size_t capacity_ = 0;
  std::size_t free_count_ = 0;
  std::vector<device::device_buffer<float>> pages_;  // empty when stride_ == 0
  device::device_buffer<float*> page_table_;         // page_table_[p] = pages_[p].data()
  // free_[0, free_count_) are the free rows (handles); a batch takes candidates from the top.
  device::device_buffer<row_index_t> free_;
};

}  // namespace gpubox::card_table
