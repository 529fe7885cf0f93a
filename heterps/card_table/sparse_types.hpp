// Plain data of the card tier's sparse store: sentinels and options. Host-only code includes this
// without dragging in device headers (STYLE.md: *_types.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/macros.hpp"

namespace gpubox::card_table {

// Row index into a card's RowPool. An index (not a pointer) so it means the same on host and card.
using row_index_t = uint32_t;

// "No row": what find() writes for a missing key, and the value of an empty table slot.
inline constexpr row_index_t kInvalidRow = std::numeric_limits<row_index_t>::max();
// Largest number of rows one pool can hold (kInvalidRow must stay out of range).
inline constexpr std::size_t kMaxRows = std::size_t{kInvalidRow} - 1;

// Most row pools (width classes) one store holds: table::kMaxWidthClasses.
inline constexpr int32_t kMaxRowPools = 8;

// What a table value names when a store keeps one RowPool per width class: the class in the top
// class bits, the row's index in that class's pool below them. With one pool there are no class
// bits and a handle is the index itself (all 32 bits, as before classes). Every pool's handles
// stay below kInvalidRow: a pool holds at most max_rows() rows (2^index_bits - 2).
struct RowHandleCodec {
  uint32_t index_bits = 32;

  // The codec of `pools` pools: the fewest class bits that number them.
  static RowHandleCodec for_pools(int32_t pools) {
    uint32_t class_bits = 0;
    while ((int32_t{1} << class_bits) < pools) ++class_bits;
    return RowHandleCodec{32 - class_bits};
  }
  GPUBOX_HD int32_t pool_of(row_index_t handle) const {
    return static_cast<int32_t>(uint64_t{handle} >> index_bits);
  }
  GPUBOX_HD row_index_t index_mask() const {
    return static_cast<row_index_t>((uint64_t{1} << index_bits) - 1);
  }
  GPUBOX_HD row_index_t first_handle(int32_t pool) const {
    return static_cast<row_index_t>(static_cast<uint64_t>(pool) << index_bits);
  }
  std::size_t max_rows() const { return (std::size_t{1} << index_bits) - 2; }
};

// Keys the open-addressing table reserves for its slot states. They are still storable: the
// table keeps them in two side slots (see hash_table.cuh), so every uint64 key is a valid key.
inline constexpr uint64_t kEmptyKey = ~uint64_t{0};       // 2^64 - 1
inline constexpr uint64_t kErasedKey = ~uint64_t{0} - 1;  // 2^64 - 2 (tombstone)

// What CardHashTable::erase_present_async found against its caller's plan, accumulated on the
// card over calls for a late read (the caller zeroes it once). Nonzero counts mean the table
// changed under the plan; `key` and its rows then name one such key (the first found: `reported`
// is set once they are written).
struct ErasePresentCheck {
  uint32_t missing = 0;   // keys that were not in the table (their free-list entry is invalid)
  uint32_t moved = 0;     // keys found at another row than planned (that row was freed)
  uint32_t reported = 0;  // 1 once key, planned_row and found_row below are written
  row_index_t planned_row = 0;
  row_index_t found_row = 0;  // kInvalidRow when missing
  uint32_t unused = 0;
  uint64_t key = 0;
};

// Linear probing visits at most this many slots from a key's home slot. An insert that would
// go further makes the table grow (rehash) and retry, so find() never probes more than this.
inline constexpr uint32_t kMaxProbe = 128;

// Bytes a RowPool page aims at: large enough that a card holds few pages (a page table of a few
// thousand entries for tens of GB), small enough that the last, partly used page wastes little.
inline constexpr std::size_t kTargetPageBytes = std::size_t{4} << 20;

// Rows per RowPool page for rows of `stride` floats: the largest power of two whose page fits
// in kTargetPageBytes (at least 1; 4096 for an index-only pool).
inline std::size_t page_rows_for(int32_t stride) {
  if (stride <= 0) return std::size_t{1} << 12;
  const std::size_t fit = kTargetPageBytes / (sizeof(float) * static_cast<std::size_t>(stride));
  std::size_t rows = 1;
  while (rows * 2 <= fit) rows *= 2;
  return rows;
}

namespace detail {
// One slot of a CardHashTable: a key and its row. 16 bytes, so a 64-byte cache line holds four
// and a lookup usually reads one line (detail/probe.cuh).
struct alignas(16) Slot {
  uint64_t key;
  row_index_t row;
  uint32_t unused;
};
static_assert(sizeof(Slot) == 16);
}  // namespace detail

struct HashTableOptions {
  // Slots allocated up front (rounded up to a power of two, at least 16).
  std::size_t initial_capacity = 1024;
  // Before each insert batch the table grows so that (live + erased + batch) / capacity stays at
  // or under this bound. In (0, 0.9].
  double max_load_factor = 0.6;
  // Floats per row of the table's RowPool; 0 makes the pool an index allocator only.
  int32_t row_stride = 0;
  // Several pools, one per width class (floats per row of each, at most kMaxRowPools), their
  // handles told apart by RowHandleCodec::for_pools; empty: the one pool of row_stride.
  std::vector<int32_t> pool_strides;
  // Rows allocated up front in the pool (rounded up to whole pages).
  std::size_t initial_rows = 0;
  // Rows per pool page, a power of two; 0: page_rows_for(row_stride).
  std::size_t page_rows = 0;
};

}  // namespace gpubox::card_table
