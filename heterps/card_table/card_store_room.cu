// CardSparseStore (card_store.hpp): making room on the card. The rows' ranks under the store's
// eviction policy and their dirty flags (whoever makes room reads which rows may leave, and which
// leave first), erasing keys, and giving a pool's free pages back (compact_pool).
#include <thrust/iterator/zip_iterator.h>
#include <thrust/partition.h>
#include <thrust/tuple.h>

#include <algorithm>

#include "common/error.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/parallel_for.cuh"

namespace gpubox::card_table {
namespace {

struct RowScores {
  RowPoolsRef pages;
  const row_index_t* rows;
  std::size_t count;
  float* scores;
  table::AccessorConfig config;
  GPUBOX_HD void operator()(std::size_t i) const {
    if (i + kRowPrefetchDistance < count) pages.prefetch(rows[i + kRowPrefetchDistance]);
    scores[i] = rows[i] == kInvalidRow ? 0.0f : table::row_score(pages.row(rows[i]), config);
  }
};

struct RowDirty {
  DirtyFlagsRef dirty;
  const row_index_t* rows;
  uint8_t* out;
  GPUBOX_HD void operator()(std::size_t i) const {
    out[i] = rows[i] != kInvalidRow && dirty[rows[i]] != 0 ? 1 : 0;
  }
};

// compact_pool: a moved row keeps its dirty flag (a row end_pass kept dirty on the card holds the
// only copy of its newest value): read before the move, set again on the row's new handle.
struct ReadDirty {
  const row_index_t* rows;
  DirtyFlagsRef dirty;
  uint8_t* out;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = dirty[rows[i]]; }
};
struct RestoreDirty {
  const row_index_t* rows;
  const uint8_t* was_dirty;
  DirtyFlagsRef dirty;
  GPUBOX_HD void operator()(std::size_t i) const {
    if (was_dirty[i] != 0) dirty[rows[i]] = 1;
  }
};

// An entry whose row is in pool `pool` at or above index `first_row` (compact_pool).
struct IsMovedEntry {
  RowHandleCodec codec;
  int32_t pool;
  std::size_t first_row;
  template <class Tuple>
  GPUBOX_HD bool operator()(const Tuple& entry) const {
    const row_index_t handle = thrust::get<1>(entry);
    return codec.pool_of(handle) == pool &&
           static_cast<std::size_t>(handle & codec.index_mask()) >= first_row;
  }
};

// The rows below a compacted pool's last needed page: its rows in use, in whole pages.
std::size_t rows_kept_by_compaction(const RowPool& rows) {
  const std::size_t page_rows = rows.page_rows();
  return (rows.in_use() + page_rows - 1) / page_rows * page_rows;
}

}  // namespace

void CardSparseStore::eviction_ranks(const row_index_t* rows, std::size_t n, float* ranks_out,
                                     const device::Stream& stream) const {
  switch (eviction_) {
    case EvictionPolicy::kLowestScore:
      device::parallel_for(stream, n, RowScores{table_.rows(), rows, n, ranks_out, config_});
      return;
  }
  GPUBOX_FAIL("card store: unknown eviction policy ", static_cast<int>(eviction_));
}

void CardSparseStore::row_dirty(const row_index_t* rows, std::size_t n, uint8_t* dirty_out,
                                const device::Stream& stream) const {
  device::parallel_for(stream, n, RowDirty{dirty_flags(), rows, dirty_out});
}

std::size_t CardSparseStore::erase(const uint64_t* keys, std::size_t n,
                                   const device::Stream& stream, row_index_t* released_rows) {
  // A released row's dirty flag is stale but harmless: whoever takes the row next sets it.
  return table_.erase(keys, n, stream, released_rows);
}

std::size_t CardSparseStore::list_slots_async(std::size_t slot_begin, std::size_t slot_end,
                                              uint64_t* keys_out, row_index_t* rows_out,
                                              float* ranks_out, uint8_t* dirty_out,
                                              const device::Stream& stream) const {
  const std::size_t n = table_.list_slots_async(slot_begin, slot_end, keys_out, rows_out, stream);
  eviction_ranks(rows_out, n, ranks_out, stream);
  row_dirty(rows_out, n, dirty_out, stream);
  return n;
}

std::size_t CardSparseStore::compact_pool(int32_t pool, const device::Stream& stream) {
  // For tests: a room of a page, made only when there is a page to free.
  const RowPool& rows = table_.pool(pool);
  if (rows_kept_by_compaction(rows) >= rows.capacity()) return 0;
  device::device_buffer<uint64_t> keys(0, card().memory(), stream);
  device::device_buffer<row_index_t> handles(0, card().memory(), stream);
  const std::size_t page_rows = rows.page_rows();
  device::device_buffer<float> records(page_rows * static_cast<std::size_t>(record_stride()),
                                       card().memory(), stream);
  device::device_buffer<row_index_t> moved_to(page_rows, card().memory(), stream);
  device::device_buffer<uint8_t> was_dirty(page_rows, card().memory(), stream);
  return compact_pool(pool, keys, handles,
                      MoveRoom{records.data(), moved_to.data(), was_dirty.data(), page_rows},
                      stream);
}

std::size_t CardSparseStore::compact_pool(int32_t pool, device::device_buffer<uint64_t>& keys,
                                          device::device_buffer<row_index_t>& handles,
                                          MoveRoom room, const device::Stream& stream) {
  GPUBOX_EXPECTS(room.rows > 0, "card ", card().rank(), ": compact_pool needs room for a row");
  RowPool& rows = table_.pool(pool);
  const std::size_t keep = rows_kept_by_compaction(rows);
  if (keep >= rows.capacity()) return 0;
  const std::size_t pages_before = rows.pages();
  // Each batch below erases its rows before inserting them again, so the erased slots grow by the
  // rows moved (at most those in use above `keep`) while the listing holds them: the erased slots
  // are purged first, the pairs saved in the listing (free until it lists), so that no insert's
  // rehash saves its own pairs (12 bytes a key) beside it.
  table_.purge_erased_for(std::min(rows.in_use(), rows.capacity() - keep), stream,
                          {&keys, &handles});
  // The entries to move (12 bytes each, in the caller's listing), then room.rows of their
  // records at a time.
  const std::size_t live = list_entries(/*dirty_only=*/false, keys, handles, stream);
  auto first = thrust::make_zip_iterator(thrust::make_tuple(keys.data(), handles.data()));
  auto moved_end = device::host_result(stream, [&] {
    return thrust::stable_partition(device::exec_policy(stream), first, first + live,
                                    IsMovedEntry{table_.codec(), pool, keep});
  });
  const auto moved = static_cast<std::size_t>(moved_end - first);
  for (std::size_t b = 0; b < moved; b += room.rows) {
    const std::size_t n = std::min(moved, b + room.rows) - b;
    gather_rows(handles.data() + b, n, room.records, stream);
    device::parallel_for(stream, n, ReadDirty{handles.data() + b, dirty_flags(), room.dirty});
    // The rows it releases land in room.handles (written again by the insert below), not in
    // the table's scratch.
    table_.erase(keys.data() + b, n, stream, room.handles);
    // What the erase freed (and what was free above `keep`) is not handed out again.
    rows.withhold_free_from(keep, stream);
    // Inserted rows come clean; the keys' new handles land in room.handles (no look-up after).
    insert_rows(keys.data() + b, room.records, n, stream, room.handles);
    device::parallel_for(stream, n, RestoreDirty{room.handles, room.dirty, dirty_flags()});
  }
  rows.withhold_free_from(keep, stream);
  rows.drop_pages_from(keep, stream);
  return pages_before - rows.pages();
}

}  // namespace gpubox::card_table
