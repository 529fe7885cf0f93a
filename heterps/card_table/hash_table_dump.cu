// CardHashTable (hash_table.hpp): listing the table. Every slot of a range as stored
// (list_slots_async), or its live entries compacted on the card with their count read back (dump,
// dump_range, dump_pool_rows_from); the side slots of the reserved keys follow the range that
// ends at capacity().
#include <thrust/copy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/tuple.h>

#include "common/error.hpp"
#include "heterps/card_table/hash_table.cuh"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/parallel_for.cuh"

namespace gpubox::card_table {
namespace {

using detail::IsLiveKey;
using detail::Slot;

// list_slots_async: every slot of a range, its row only when live.
struct ListSlots {
  const Slot* slots;
  uint64_t* keys;
  row_index_t* rows;
  GPUBOX_HD void operator()(std::size_t i) const {
    const uint64_t key = slots[i].key;
    keys[i] = key;
    rows[i] = IsLiveKey{}(key) ? slots[i].row : kInvalidRow;
  }
};
// The side slots: kErasedKey's row, then kEmptyKey's (kInvalidRow when absent).
struct ListSideSlots {
  const row_index_t* side_rows;
  uint64_t* keys;
  row_index_t* rows;
  GPUBOX_HD void operator()(std::size_t s) const {
    keys[s] = s == 0 ? kErasedKey : kEmptyKey;
    rows[s] = side_rows[s];
  }
};

// dump_range's entries: entry i < n is slot i of the range, entries n and n + 1 (when listed)
// the side slots of kErasedKey and kEmptyKey.
struct RangeEntries {
  const Slot* slots;
  const row_index_t* side_rows;
  std::size_t n;
};
// Entry i as (key, row).
struct RangeEntry {
  RangeEntries range;
  GPUBOX_HD thrust::tuple<uint64_t, row_index_t> operator()(std::size_t i) const {
    if (i < range.n) return thrust::make_tuple(range.slots[i].key, range.slots[i].row);
    // Read by value (the reserved keys are host constants: nvcc refuses a reference to them).
    const uint64_t key = i == range.n ? uint64_t{kErasedKey} : uint64_t{kEmptyKey};
    return thrust::make_tuple(key, range.side_rows[i - range.n]);
  }
};
// Whether entry i holds a key: a slot's live key, a side slot's row.
struct IsLiveRangeEntry {
  RangeEntries range;
  GPUBOX_HD bool operator()(std::size_t i) const {
    return i < range.n ? IsLiveKey{}(range.slots[i].key)
                       : range.side_rows[i - range.n] != kInvalidRow;
  }
};
// Whether entry i holds a key whose row is in pool `pool` at index `first_row` or above.
struct IsPoolRowFrom {
  RangeEntries range;
  RowHandleCodec codec;
  int32_t pool;
  std::size_t first_row;
  GPUBOX_HD bool operator()(std::size_t i) const {
    if (!IsLiveRangeEntry{range}(i)) return false;
    const row_index_t row = i < range.n ? range.slots[i].row : range.side_rows[i - range.n];
    return codec.pool_of(row) == pool &&
           static_cast<std::size_t>(row & codec.index_mask()) >= first_row;
  }
};
// The entries [0, entries) of `range` that `listed` picks, in order, into keys_out / rows_out:
// one stream compaction, its count read on the host.
template <class Listed>
std::size_t copy_entries(const RangeEntries& range, std::size_t entries, Listed listed,
                         uint64_t* keys_out, row_index_t* rows_out, const device::Stream& stream) {
  auto out = thrust::make_zip_iterator(thrust::make_tuple(keys_out, rows_out));
  auto end = device::host_result(stream, [&] {
    const thrust::counting_iterator<std::size_t> first(0);
    return thrust::copy_if(
        device::exec_policy(stream), thrust::make_transform_iterator(first, RangeEntry{range}),
        thrust::make_transform_iterator(first + entries, RangeEntry{range}), first, out, listed);
  });
  return static_cast<std::size_t>(end - out);
}
// The range [slot_begin, slot_end) of a listing lies within the `capacity` slots of card
// `card_rank`'s table.
void expect_slot_range(int card_rank, std::size_t slot_begin, std::size_t slot_end,
                       std::size_t capacity) {
  GPUBOX_EXPECTS(slot_begin <= slot_end && slot_end <= capacity, "card ", card_rank, ": slots [",
                 slot_begin, ", ", slot_end, ") are not in the table's ", capacity);
}
}  // namespace

std::size_t CardHashTable::list_slots_async(std::size_t slot_begin, std::size_t slot_end,
                                            uint64_t* keys_out, row_index_t* rows_out,
                                            const device::Stream& stream) const {
  expect_slot_range(card_->rank(), slot_begin, slot_end, slots_.size());
  const std::size_t n = slot_end - slot_begin;
  device::parallel_for(stream, n, ListSlots{slots_.data() + slot_begin, keys_out, rows_out});
  if (slot_end < slots_.size()) return n;
  device::parallel_for(stream, 2, ListSideSlots{side_rows_.data(), keys_out + n, rows_out + n});
  return n + 2;
}

std::size_t CardHashTable::dump(uint64_t* keys_out, row_index_t* rows_out,
                                const device::Stream& stream) const {
  const std::size_t count = dump_range(0, slots_.size(), keys_out, rows_out, stream);
  GPUBOX_EXPECTS(count == size_, "card ", card_->rank(), ": hash table dump found ", count,
                 " keys, size() says ", size_, " (inserts through insert_ref need recount())");
  return count;
}

std::size_t CardHashTable::dump_range(std::size_t slot_begin, std::size_t slot_end,
                                      uint64_t* keys_out, row_index_t* rows_out,
                                      const device::Stream& stream) const {
  expect_slot_range(card_->rank(), slot_begin, slot_end, slots_.size());
  const std::size_t n = slot_end - slot_begin;
  // The reserved keys' side slots follow the range that ends at capacity(); listed on the card
  // with the slots, so no readback of their rows (a pageable copy and a wait) precedes the count.
  const std::size_t entries = slot_end == slots_.size() ? n + 2 : n;
  const RangeEntries range{slots_.data() + slot_begin, side_rows_.data(), n};
  return copy_entries(range, entries, IsLiveRangeEntry{range}, keys_out, rows_out, stream);
}

std::size_t CardHashTable::dump_pool_rows_from(int32_t pool, std::size_t first_row,
                                               uint64_t* keys_out, row_index_t* rows_out,
                                               const device::Stream& stream) const {
  const RangeEntries range{slots_.data(), side_rows_.data(), slots_.size()};
  return copy_entries(range, slots_.size() + 2, IsPoolRowFrom{range, codec_, pool, first_row},
                      keys_out, rows_out, stream);
}

}  // namespace gpubox::card_table
