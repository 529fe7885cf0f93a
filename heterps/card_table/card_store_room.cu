// CardSparseStore (card_store.hpp): making room on the card. The rows' ranks under the store's
// eviction policy and their dirty flags (whoever makes room reads which rows may leave, and which
// leave first), erasing keys, and giving a pool's free pages back (compact_pool).
#include "common/error.hpp"
#include "heterps/card_table/card_store.cuh"
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

// compact_pool: row from[r]'s record and dirty flag copied onto row to[r] (a free row below the
// pages kept), the old flag cleared; one thread per (row, field). A moved row keeps its dirty flag:
// a row end_pass kept dirty on the card holds the only copy of its newest value.
struct MoveRows {
  RowPagesRef pages;
  DirtyFlagsRef dirty;
  const row_index_t* from;
  const row_index_t* to;
  GPUBOX_HD void operator()(std::size_t i) const {
    const auto stride = static_cast<std::size_t>(pages.stride);
    const std::size_t r = i / stride;
    const std::size_t field = i % stride;
    pages.row(to[r])[field] = pages.row(from[r])[field];
    if (field != 0) return;
    dirty[to[r]] = dirty[from[r]];
    dirty[from[r]] = 0;
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
  // For tests: a listing of its own, made only when there is a page to free.
  const RowPool& rows = table_.pool(pool);
  if (rows_kept_by_compaction(rows) >= rows.capacity()) return 0;
  device::device_buffer<uint64_t> keys(0, card().memory(), stream);
  device::device_buffer<row_index_t> handles(0, card().memory(), stream);
  return compact_pool(pool, keys, handles, stream);
}

std::size_t CardSparseStore::compact_pool(int32_t pool, device::device_buffer<uint64_t>& keys,
                                          device::device_buffer<row_index_t>& handles,
                                          const device::Stream& stream) {
  RowPool& rows = table_.pool(pool);
  const std::size_t keep = rows_kept_by_compaction(rows);
  if (keep >= rows.capacity()) return 0;
  const std::size_t pages_before = rows.pages();
  // A wait: the free rows above `keep` leave the free list, so the rows above it that are left
  // are the rows in use there, the ones to move, and every free row is below it.
  const std::size_t moved = rows.capacity() - keep - rows.withhold_free_from(keep, stream);
  if (moved > 0) {
    // A wait: their keys and handles, in the caller's listing (12 bytes a key).
    keys.resize_discard(size());
    handles.resize_discard(size());
    const std::size_t listed =
        table_.dump_pool_rows_from(pool, keep, keys.data(), handles.data(), stream);
    GPUBOX_EXPECTS(listed == moved, "card ", card().rank(), ": pool ", pool, " holds ", moved,
                   " rows in use from row ", keep, ", its table ", listed);
    // Stream-ordered from here, all of them at once: each row onto one of the free rows the
    // pool hands out next (below `keep`), its flag with it, its key pointed there. No erase: no
    // erased slot, no rehash, and the table's count stays.
    const row_index_t* to = rows.peek_free(moved);
    device::parallel_for(stream, moved * static_cast<std::size_t>(rows.stride()),
                         MoveRows{rows.rows(), dirty_flags(), handles.data(), to});
    table_.repoint_async(keys.data(), to, moved, stream);
    rows.take_free(moved);
  }
  rows.drop_pages_from(keep, stream);
  return pages_before - rows.pages();
}

}  // namespace gpubox::card_table
