// The device view of a CardSparseStore (card_store.hpp), for functors: HeterComm's pull records
// and optimizer step read and update rows through it.
#pragma once

#include <cstdint>

#include "heterps/card_table/card_store.hpp"
#include "heterps/card_table/hash_table.cuh"

namespace gpubox::card_table {

// How far ahead a loop over rows at random (pull records, optimizer updates, a pass's gathers
// and scatters) prefetches on the cpu backend (RowPagesRef::prefetch): at 10^8 keys nearly every
// row is a cache and TLB miss, and the work of ~8 rows covers one.
inline constexpr std::size_t kRowPrefetchDistance = 8;

// The dirty flags of a store's pools, by row handle. Trivially copyable.
struct DirtyFlagsRef {
  uint8_t* pools[kMaxRowPools] = {};
  RowHandleCodec codec;

  GPUBOX_HD uint8_t& operator[](row_index_t handle) const {
    return pools[codec.pool_of(handle)][handle & codec.index_mask()];
  }
};

// Device view for functors (optimizer, pull): rows by handle, find by key, dirty marks.
// Trivially copyable. Invalidated by any store call that may grow it (insert_rows,
// lookup_or_create with create_missing, reserve, clear): take a fresh ref after those.
// Thread-safety inside a kernel: any number of threads may find and read; a row may be written
// by one thread at a time (HeterComm merges a key's updates before applying them).
class CardStoreRef {
 public:
  CardStoreRef() = default;
  CardStoreRef(RowPoolsRef rows, DirtyFlagsRef dirty, TableFindRef table, table::RowLayout layout)
      : rows_(rows), dirty_(dirty), table_(table), layout_(layout) {}

  // The record layout (table::record_layout): a row says its own width (RowLayout::of_row).
  GPUBOX_HD const table::RowLayout& layout() const { return layout_; }
  GPUBOX_HD float* row(row_index_t index) const { return rows_.row(index); }
  // Hints for a loop over rows at random (RowPagesRef::prefetch; nothing on the card): a read of
  // the row soon, or an update of it (the row and its dirty mark).
  GPUBOX_HD GPUBOX_FORCEINLINE void prefetch_read(row_index_t index) const {
    rows_.prefetch(index);
  }
  GPUBOX_HD GPUBOX_FORCEINLINE void prefetch_update(row_index_t index) const {
    rows_.prefetch</*kWrite=*/true>(index);
#if !GPUBOX_ON_DEVICE
    if (index != kInvalidRow) __builtin_prefetch(&dirty_[index], 1);
#endif
  }
  // The key's row index, or kInvalidRow when the card does not hold it.
  GPUBOX_HD row_index_t find(uint64_t key) const { return table_.find(key); }
  // Hint for a loop of finds over keys at random: `key` is looked up soon (cpu backend: its home
  // line in the hash table; nothing on the card).
  GPUBOX_HD GPUBOX_FORCEINLINE void prefetch_find(uint64_t key) const { table_.prefetch(key); }
  // The row changed since it came from the host tier: end_pass writes it back. Several threads
  // may mark one row (all write 1).
  GPUBOX_HD void mark_dirty(row_index_t index) const { dirty_[index] = 1; }
  GPUBOX_HD bool is_dirty(row_index_t index) const { return dirty_[index] != 0; }

 private:
  RowPoolsRef rows_{};
  DirtyFlagsRef dirty_{};
  TableFindRef table_{};
  table::RowLayout layout_{};
};

}  // namespace gpubox::card_table
