#include "heterps/pass/make_room.hpp"

#include <algorithm>
#include <cstring>

#include "common/error.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/card_table/eviction_policy.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/row_marks.hpp"

namespace gpubox::pass {
namespace {

using card_table::EvictionCandidate;
using card_table::row_index_t;

// Removes the `excess` candidates that leave first from card `c` (they must be clean). Returns
// the rows removed.
uint64_t evict_first(const PassCards& cards, int c, std::vector<EvictionCandidate>& candidates,
                     uint64_t kept_dirty, std::size_t excess) {
  GPUBOX_EXPECTS(candidates.size() >= excess, "card ", cards.card(c).rank(), ": cannot evict ",
                 excess, " rows, only ", candidates.size(),
                 " are outside the pass and clean (the last end_pass kept ", kept_dirty,
                 " rows dirty)");
  card_table::select_victims(candidates, excess);
  std::vector<uint64_t> victims(excess);
  for (std::size_t i = 0; i < excess; ++i) victims[i] = candidates[i].key;
  return cards.erase_from_card(c, victims);
}

}  // namespace

uint64_t evict_outside(const PassCards& cards, int c, const std::vector<row_index_t>& pass_rows,
                       uint64_t kept_dirty, std::size_t excess) {
  card_table::CardSparseStore& store = cards.store(c);
  const device::Stream& stream = cards.card(c).stream();
  CardPassBuffers& lent = cards.kept(c);
  device::device_buffer<uint64_t>& listed_keys = lent.listed_keys;
  device::device_buffer<row_index_t>& listed_rows = lent.listed_rows;
  // Keys, row indices and ranks only, on the host for the choice. On the card, only the kept
  // listing (12 bytes per resident key): once the keys are on the host, their 8 bytes a key on
  // the card take the ranks (4), so eviction holds no card memory beside the listing.
  const std::size_t count =
      store.list_entries(/*dirty_only=*/false, listed_keys, listed_rows, stream);
  std::vector<uint64_t> keys = device::to_host(listed_keys.data(), count, stream);
  std::vector<row_index_t> rows = device::to_host(listed_rows.data(), count, stream);
  static_assert(sizeof(float) <= sizeof(uint64_t), "a rank fits in a listed key's room");
  float* d_ranks = reinterpret_cast<float*>(listed_keys.data());
  store.eviction_ranks(listed_rows.data(), count, d_ranks, stream);
  const std::vector<float> ranks = device::to_host(d_ranks, count, stream);
  // The pass's rows, marked by row index: one look-up per resident key instead of a binary
  // search over the pass's keys (n log p: most of the choice at 10^7 rows a card).
  row_index_t row_end = 0;
  for (row_index_t row : rows) row_end = std::max<row_index_t>(row_end, row + 1);
  RowMarks in_pass(row_end, rows.size());
  for (row_index_t row : pass_rows) in_pass.mark(row);
  if (kept_dirty > 0) {
    // Rows the last end_pass kept dirty (its `keep`) stay too, whatever this pass holds: their
    // newest value is only here.
    const std::size_t count =
        store.list_entries(/*dirty_only=*/true, listed_keys, listed_rows, stream);
    for (row_index_t row : device::to_host(listed_rows.data(), count, stream)) in_pass.mark(row);
  }
  in_pass.seal();
  std::vector<EvictionCandidate> candidates;
  candidates.reserve(keys.size() - std::min(keys.size(), pass_rows.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!in_pass.has(rows[i])) candidates.push_back({ranks[i], keys[i]});
  }
  rows = {};
  return evict_first(cards, c, candidates, kept_dirty, excess);
}

uint64_t evict_among(const PassCards& cards, int c, const std::vector<uint64_t>& keys,
                     const std::vector<uint32_t>& at, const std::vector<row_index_t>& rows,
                     uint64_t kept_dirty, std::size_t excess) {
  card_table::CardSparseStore& store = cards.store(c);
  const device::Stream& stream = cards.card(c).stream();
  std::vector<EvictionCandidate> candidates;
  candidates.reserve(rows.size());
  // The ranks and dirty flags of as many rows as the kept listing holds at a time (under a budget
  // every row of the pass at once: one wait), its row indices in listed_rows, ranks and flags in
  // the listed keys' room (8 bytes a row: 4 + 1), nothing allocated; the listing is free (the
  // pass's look-up was read). Without a listing as large, a kept page at a time (its row indices
  // in page_rows, ranks and flags in the staging page: a row's floats, at least 2, a row). A
  // batch's flags follow its ranks, so one copy reads both back: a copy into pageable memory
  // blocks the host on CUDA (device rule 2), so two would be two waits.
  CardPassBuffers& lent = cards.kept(c);
  const KeptRoom room =
      PassCards::kept_room(lent, std::min(lent.listed_keys.capacity(), lent.listed_rows.capacity()),
                           PassCards::page_rows_kept(store.page_rows()));
  float* d_ranks = room.in_listing ? reinterpret_cast<float*>(room.keys) : lent.staged.data();
  static_assert(sizeof(float) + 1 <= sizeof(uint64_t), "a rank and a flag fit a listed key's room");
  constexpr std::size_t kBytesPerRow = sizeof(float) + 1;
  GPUBOX_EXPECTS(room.in_listing || cards.stride() * sizeof(float) >= kBytesPerRow,
                 "evict_among: a row's ranks and flags fit the staging page");
  std::vector<uint8_t> back(std::min(rows.size(), room.entries) * kBytesPerRow);
  for (std::size_t b = 0; b < rows.size(); b += room.entries) {
    const std::size_t n = std::min(rows.size(), b + room.entries) - b;
    uint8_t* d_dirty = reinterpret_cast<uint8_t*>(d_ranks + n);
    device::copy_async(room.rows, rows.data() + b, n, stream);
    store.eviction_ranks(room.rows, n, d_ranks, stream);
    store.row_dirty(room.rows, n, d_dirty, stream);
    device::copy_async(back.data(), reinterpret_cast<const uint8_t*>(d_ranks), n * kBytesPerRow,
                       stream);
    stream.synchronize();
    for (std::size_t i = 0; i < n; ++i) {
      // A dirty row (kept by a `keep` wider than this pass's keys) stays: only here.
      if (back[n * sizeof(float) + i] != 0) continue;
      float rank;
      std::memcpy(&rank, back.data() + i * sizeof(float), sizeof(float));
      candidates.push_back({rank, keys[at[b + i]]});
    }
  }
  return evict_first(cards, c, candidates, kept_dirty, excess);
}

std::size_t fit_pools(const PassCards& cards, int c, const OwnedKeys& missing) {
  card_table::CardSparseStore& store = cards.store(c);
  const auto page_bytes_after_insert = [&] {
    std::vector<std::size_t> need(static_cast<std::size_t>(store.pool_count()), 0);
    for (const int32_t slot : missing.slots) {
      const int32_t pool = store.pool_of_slot(slot);
      if (pool >= 0) ++need[static_cast<std::size_t>(pool)];
    }
    std::size_t bytes = 0;
    for (int32_t p = 0; p < store.pool_count(); ++p) {
      const card_table::RowPool& pool = store.pool(p);
      const std::size_t wanted = need[static_cast<std::size_t>(p)];
      const std::size_t lacking = wanted > pool.free_count() ? wanted - pool.free_count() : 0;
      bytes +=
          (pool.pages() + (lacking + pool.page_rows() - 1) / pool.page_rows()) * pool.page_bytes();
    }
    return bytes;
  };
  if (page_bytes_after_insert() <= cards.plan().row_page_bytes) return 0;
  // With at most the row budget rows in all, compacted pools hold at most the plan's pages.
  std::size_t freed = 0;
  // The moved rows' listing in the kept one: nothing allocated but the pools' pages.
  CardPassBuffers& lent = cards.kept(c);
  for (int32_t p = 0; p < store.pool_count(); ++p) {
    freed += store.compact_pool(p, lent.listed_keys, lent.listed_rows, cards.card(c).stream());
  }
  const std::size_t bytes = page_bytes_after_insert();
  GPUBOX_EXPECTS(bytes <= cards.plan().row_page_bytes, "card ", cards.card(c).rank(),
                 ": the row pools would hold ", bytes,
                 " bytes of pages after compaction, the plan ", cards.plan().row_page_bytes);
  return freed;
}

}  // namespace gpubox::pass
