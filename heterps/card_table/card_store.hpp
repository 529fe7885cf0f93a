// CardSparseStore: one card's sparse parameters — hash table (key -> row handle), a row pool of
// full sparse rows (table/sparse_row/accessor.hpp layout) per width class, and a dirty flag per
// row.
//
// Width classes (hyper_parameters.slot_dims): each class's rows live in their own pool at their
// own stride, so a width-4 row takes a width-4 row's bytes; the table's value is a handle naming
// the pool and the row (RowHandleCodec). A missing key's slot decides its class; a row from the
// host tier says its width (its mf_dim field). The records the API moves (insert_rows,
// read_rows, gather_rows, collect_*) are at the record stride (table::record_layout: the widest
// class's), each row at the start of its record, zeros after it. With one class the store holds
// one pool and a handle is the row index.
//
// Eviction is a named policy of the store (EvictionPolicy, eviction_policy.hpp): it ranks the
// rows (eviction_ranks), and whoever makes room erases the lowest-ranked clean rows it may.
//
// Who uses it: the pass manager moves rows between the host tier and the card (insert_rows,
// read_rows, collect_dirty/clear_dirty, erase) and makes room by the policy; HeterComm looks rows
// up and applies the optimizer through CardStoreRef inside its functors (lookup_or_create, ref()).
// Rows inserted from the host tier arrive clean; a row created on the card, or updated through
// the ref (mark_dirty), is dirty until clear_dirty.
//
// This header is the host API (g++ alone compiles it); the device view for functors
// (CardStoreRef) is in card_store.cuh.
//
// Bulk API over card ranges, stream last; calls that return a count synchronize `stream`.
// Not thread-safe: one card thread drives a store. Move-only; owns all its memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "heterps/card_table/eviction_policy.hpp"
#include "heterps/card_table/hash_table.hpp"
#include "heterps/card_table/sparse_types.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::card_table {

class CardStoreRef;    // card_store.cuh
struct DirtyFlagsRef;  // card_store.cuh

class CardSparseStore {
 public:
  // Rows follow RowLayout::for_slot(config, slot) (one pool per width_classes(config));
  // options.row_stride and options.pool_strides are ignored. `eviction`: which rows leave first
  // when room is made (eviction_ranks). The card must outlive the store.
  CardSparseStore(device::Card& card, const table::AccessorConfig& config,
                  const HashTableOptions& options = {},
                  EvictionPolicy eviction = EvictionPolicy::kLowestScore);
  CardSparseStore(CardSparseStore&&) noexcept = default;
  CardSparseStore& operator=(CardSparseStore&&) noexcept = default;
  CardSparseStore(const CardSparseStore&) = delete;
  CardSparseStore& operator=(const CardSparseStore&) = delete;

  // Stores full rows from the host tier (`rows`: n records of record_stride() floats, card
  // memory), clean. A key already on the card has its row overwritten (at the width it has).
  // Keys should be unique within the batch (for a repeated key one of its rows is kept). A row
  // of a width the config does not create is an error. Returns how many keys were new.
  // Synchronizes. `row_room` (optional, card memory for n row indices, its contents lost) takes
  // the keys' rows; without it the store's own scratch does (grown to the largest insert).
  std::size_t insert_rows(const uint64_t* keys, const float* rows, std::size_t n,
                          const device::Stream& stream, row_index_t* row_room = nullptr);
  // rows_out[i] = the record of keys[i] (n * record_stride() floats, card memory), bit-exact. A key
  // the card does not hold is an error naming the key and the card. Synchronizes.
  void read_rows(const uint64_t* keys, std::size_t n, float* rows_out,
                 const device::Stream& stream) const;
  // out_row_indices[i] = the row handle of keys[i]. A missing key gets a new row in its slot's
  // width class (table::init_row with slots[i], or slot 0 when slots is null; marked dirty) when
  // `create_missing`, else kInvalidRow. A new key repeated in the batch takes the slot (and so the
  // width) of its first occurrence, as every tier does. *created (when given) = how many rows
  // were created.
  // Synchronizes.
  void lookup_or_create(const uint64_t* keys, const int32_t* slots, std::size_t n,
                        row_index_t* out_row_indices, bool create_missing, std::size_t* created,
                        const device::Stream& stream);
  // lookup_or_create(create_missing = true) in two halves, so a step can fold the miss count's
  // readback into a wait it makes anyway: lookup_async writes out_row_indices (kInvalidRow for
  // a missing key) and enqueues the miss count's copy to a pinned host word; once the caller
  // has synchronized `stream`, misses() reads it, and create_missing_rows(misses()) creates the
  // missing rows exactly as lookup_or_create does (returns how many; synchronizes).
  // Sizes lookup_async's scratch for up to n keys, so a step that calls this before its
  // collectives allocates nothing after them (device rule 1).
  void reserve_lookups(std::size_t n);
  void lookup_async(const uint64_t* keys, std::size_t n, row_index_t* out_row_indices,
                    const device::Stream& stream);
  std::size_t misses() const { return static_cast<std::size_t>(host_misses_[0]); }
  // lookup_async without the miss count's copy: the count stays on the card
  // (miss_count_on_card(), valid until the next lookup), for a step that checks it late
  // (HeterComm's planned steps). Stream-ordered; allocates nothing after reserve_lookups(n).
  void lookup_on_card(const uint64_t* keys, std::size_t n, row_index_t* out_row_indices,
                      const device::Stream& stream);
  const unsigned long long* miss_count_on_card() const { return miss_count_.data(); }
  std::size_t create_missing_rows(const uint64_t* keys, const int32_t* slots, std::size_t n,
                                  row_index_t* out_row_indices, std::size_t missing,
                                  const device::Stream& stream);
  // Every live key and its row handle (slot order: unspecified across stores and runs, and so,
  // after a compact_pool, are the handles themselves: hash_table.hpp) into keys_out / rows_out,
  // resized to the count; only the dirty rows when `dirty_only`. 12 bytes per entry, no row is
  // copied. Returns the count. Synchronizes.
  std::size_t list_entries(bool dirty_only, device::device_buffer<uint64_t>& keys_out,
                           device::device_buffer<row_index_t>& rows_out,
                           const device::Stream& stream) const;
  // list_entries(dirty_only = false) of the table's slots [slot_begin, slot_end) only
  // (CardHashTable::dump_range): a listing a bounded range at a time, up to table().capacity().
  std::size_t list_entries_range(std::size_t slot_begin, std::size_t slot_end,
                                 device::device_buffer<uint64_t>& keys_out,
                                 device::device_buffer<row_index_t>& rows_out,
                                 const device::Stream& stream) const;
  // rows_out[i * record_stride() ...] = the record of the row with handle rows[i] (card memory),
  // bit-exact, zeros past the row's own stride; one thread per (record, field). Stream-ordered.
  void gather_rows(const row_index_t* rows, std::size_t n, float* rows_out,
                   const device::Stream& stream) const;
  // addresses_out[i] = where the row with handle rows[i] (card memory) lies in card memory, at
  // its own stride (RowLayout::for_slot of its class: no padding to the record stride); valid
  // until the row is released or its pool compacted (compact_pool), however the pool grows.
  // `addresses_out` is memory the card writes (on cuda card memory, or mapped pinned memory).
  // On the cpu backend, whose card memory is the host's, the host reads rows through them where
  // they lie (the pass write-back's pushes: HostTier::push_at). Stream-ordered.
  void row_addresses(const row_index_t* rows, std::size_t n, const float** addresses_out,
                     const device::Stream& stream) const;
  // ranks_out[i] = the rank under eviction_policy() of the row with handle rows[i] (card
  // memory; lower leaves first: EvictionCandidate), to pick victims without copying rows
  // (kLowestScore: table::row_score); 0 for kInvalidRow. Stream-ordered.
  void eviction_ranks(const row_index_t* rows, std::size_t n, float* ranks_out,
                      const device::Stream& stream) const;
  // dirty_out[i] = 1 when the row with handle rows[i] (card memory) is dirty (its newest value
  // only on the card), else 0 (kInvalidRow too): eviction must spare it. Stream-ordered.
  void row_dirty(const row_index_t* rows, std::size_t n, uint8_t* dirty_out,
                 const device::Stream& stream) const;
  // list_entries + gather_rows in one call: copies every dirty row (collect_dirty) or every row
  // (collect_all) with its key into keys_out / rows_out, resized to the count (slot order).
  // Holds a second copy of the rows it collects: for tests and small stores; the pass manager
  // streams list_entries through gather_rows a page at a time instead. Synchronizes.
  std::size_t collect_dirty(device::device_buffer<uint64_t>& keys_out,
                            device::device_buffer<float>& rows_out,
                            const device::Stream& stream) const;
  std::size_t collect_all(device::device_buffer<uint64_t>& keys_out,
                          device::device_buffer<float>& rows_out,
                          const device::Stream& stream) const;
  // Marks every row clean. Stream-ordered.
  void clear_dirty(const device::Stream& stream);
  // Marks the rows with these indices (card memory) clean; the others keep their flags.
  // Stream-ordered.
  void clear_dirty(const row_index_t* rows, std::size_t n, const device::Stream& stream);
  // Removes the keys (absent ones are ignored); returns how many were removed. Synchronizes.
  // `released_rows` (optional, card memory for n row indices, its contents lost) takes the rows
  // released; without it the table's own scratch does (grown to the largest erase).
  std::size_t erase(const uint64_t* keys, std::size_t n, const device::Stream& stream,
                    row_index_t* released_rows = nullptr);
  // erase() of keys known to be on the card and distinct, without a wait: see
  // CardHashTable::erase_present_async (`planned_rows`, `reserved`, *check's contract).
  // Stream-ordered.
  void erase_present_async(const uint64_t* keys, const row_index_t* planned_rows, std::size_t n,
                           std::size_t reserved, ErasePresentCheck* check,
                           const device::Stream& stream) {
    table_.erase_present_async(keys, planned_rows, n, reserved, check, stream);
  }
  // insert_rows() of keys known to be absent and distinct, without a wait or an allocation
  // (CardHashTable::insert_new_async: *failed's contract and its repair): rows_out[i] = the row
  // keys[i] was given, its record written there and marked clean. Requires n <= new_key_room()
  // and one pool. Stream-ordered.
  void insert_new_rows_async(const uint64_t* keys, const float* rows, std::size_t n,
                             row_index_t* rows_out, uint32_t* failed, const device::Stream& stream);
  std::size_t new_key_room() const { return table_.new_key_room(); }
  // CardHashTable::release_unused. Synchronizes.
  void release_unused_rows(const row_index_t* rows, std::size_t n, const device::Stream& stream) {
    table_.release_unused(rows, n, stream);
  }
  // CardHashTable::release_unused_async. Stream-ordered: no wait, no allocation.
  void release_unused_rows_async(const row_index_t* rows, std::size_t n,
                                 const device::Stream& stream) {
    table_.release_unused_async(rows, n, stream);
  }
  // list_entries_range() with each entry's eviction rank and dirty flag, without a wait: every
  // slot of [slot_begin, slot_end) (CardHashTable::list_slots_async: kInvalidRow unless live,
  // the side slots after the last range) into keys_out, rows_out, ranks_out and dirty_out (card
  // memory; an entry that is not live gets rank 0 and flag 0). Returns the entries written.
  // Stream-ordered: no wait, no allocation.
  std::size_t list_slots_async(std::size_t slot_begin, std::size_t slot_end, uint64_t* keys_out,
                               row_index_t* rows_out, float* ranks_out, uint8_t* dirty_out,
                               const device::Stream& stream) const;
  // Removes everything (capacity kept). Stream-ordered.
  void clear(const device::Stream& stream);
  // Gives pool `pool`'s free pages back: the rows above its last needed page move below it, then
  // the pages above are freed. A pool keeps its pages when its rows leave, so a shift in the mix
  // of widths would otherwise hold the pages of both. A moved row keeps its record and its dirty
  // flag (a row end_pass kept dirty is the only copy of its newest value), at a row the pool's
  // free list hands out next, in the listing's slot order (unspecified: hash_table.hpp); its key
  // is pointed there, not erased and inserted again. Returns the pages freed. Two host waits
  // whatever the rows (none when no page can be freed, one when no row moves): the pool's free
  // rows above the pages kept withheld (how many rows move follows), and the listing of the rows
  // to move; the moves themselves are two launches, stream-ordered, and the pages are freed on
  // the card's stream after them (RowPool::drop_pages_from: a wait more when `stream` is
  // another). The listing (12 bytes a key, room for
  // size()) lands in `listed_keys` / `listed_rows` (a caller's, resized, contents lost: the pass
  // boundary lends its kept listing, so a compaction allocates nothing). The first form, for
  // tests, makes its own listing (only when a page can be freed).
  std::size_t compact_pool(int32_t pool, const device::Stream& stream);
  std::size_t compact_pool(int32_t pool, device::device_buffer<uint64_t>& listed_keys,
                           device::device_buffer<row_index_t>& listed_rows,
                           const device::Stream& stream);
  // Grows so that `new_keys` more keys fit without growth inside the next batch. A rehash it
  // makes (growth, or a purge of erased slots) saves its pairs in `room` (CardHashTable::rehash).
  void reserve(std::size_t new_keys, const device::Stream& stream, RehashRoom room = {});
  // CardHashTable::purge_erased_for: the erased slots reclaimed, at the same size (doubled, with
  // a warning, only where a probe run would pass kMaxProbe), when they would keep `new_keys` more
  // keys from new_key_room(). Synchronizes when it purges; saves its pairs in `room`.
  void purge_erased_for(std::size_t new_keys, const device::Stream& stream, RehashRoom room = {}) {
    table_.purge_erased_for(new_keys, stream, room);
  }
  // Sizes the table and the per-row index memory (free list, dirty flags) for `keys` keys once,
  // so that holding up to that many never reallocates them (rows still come page by page). See
  // CardHashTable::reserve_capacity. Synchronizes.
  void reserve_capacity(std::size_t keys, const device::Stream& stream);

  std::size_t size() const { return table_.size(); }
  // Floats per record (the widest class's row).
  int32_t record_stride() const { return layout_.stride(); }
  // Width classes: pool c holds the rows of embedx width classes().dims[c].
  const table::WidthClasses& classes() const { return classes_; }
  int32_t pool_count() const { return table_.pool_count(); }
  // The pool (width class) of the rows of `slot`.
  int32_t pool_of_slot(int32_t slot) const {
    return classes_.class_of(table::slot_mf_dim(config_, slot));
  }
  // Bytes of a row of pool `pool` (by default the widest: a record's).
  std::size_t bytes_per_row(int32_t pool = -1) const { return this->pool(pool).row_bytes(); }
  // Card bytes held (slots, row pages, page table, free list, dirty flags, scratch).
  std::size_t memory_bytes() const;
  // Bytes and rows of one page of pool `pool` (rows are allocated a page at a time; by default
  // the widest pool's, whose pages hold a page of records).
  std::size_t page_bytes(int32_t pool = -1) const { return this->pool(pool).page_bytes(); }
  std::size_t page_rows(int32_t pool = -1) const { return this->pool(pool).page_rows(); }
  // Pool `pool` (-1: the widest).
  const RowPool& pool(int32_t pool) const {
    return table_.pool(pool < 0 ? table_.pool_count() - 1 : pool);
  }
  const table::RowLayout& layout() const { return layout_; }
  const table::AccessorConfig& config() const { return config_; }
  const CardHashTable& table() const { return table_; }
  EvictionPolicy eviction_policy() const { return eviction_; }
  device::Card& card() const { return table_.card(); }

  CardStoreRef ref();

 private:
  // The dirty flags by row handle (card memory).
  DirtyFlagsRef dirty_flags() const;
  // Keeps one dirty flag per pool row after a pool grew (new rows clean).
  void sync_dirty_capacity(const device::Stream& stream);
  // CardHashTable::insert with the new key at position i taking a row of pool pools[i] (card
  // memory): one insert per pool with keys. out_created may be null. Synchronizes.
  std::size_t insert_by_pool(const uint64_t* keys, std::size_t n, const int32_t* pools,
                             row_index_t* out_rows, uint8_t* out_created,
                             const device::Stream& stream);
  // Writes n records (record_stride() floats each) into the rows with handles rows[i], each row
  // its own stride. Stream-ordered.
  void scatter_records(const float* records, const row_index_t* rows, std::size_t n,
                       const device::Stream& stream);
  std::size_t collect(bool dirty_only, device::device_buffer<uint64_t>& keys_out,
                      device::device_buffer<float>& rows_out, const device::Stream& stream) const;
  // Counts kInvalidRow among rows[0, n) into *miss_count_ (card memory): per-chunk partial
  // counts, then one sum, so no thread contends for one address.
  void count_misses(const row_index_t* rows, std::size_t n, const device::Stream& stream);

  table::AccessorConfig config_;
  table::RowLayout layout_;  // the record layout
  table::WidthClasses classes_;
  EvictionPolicy eviction_;
  CardHashTable table_;
  std::vector<device::device_buffer<uint8_t>> dirty_;  // per pool, a flag per row
  // Scratch reused across calls.
  mutable device::device_buffer<row_index_t> rows_scratch_;
  mutable device::device_buffer<uint8_t> created_scratch_;
  mutable device::device_buffer<uint64_t> keys_scratch_;
  mutable device::device_buffer<uint64_t> positions_scratch_;
  // insert_by_pool's (several pools only): each position's pool, positions grouped by pool,
  // their keys, rows and created flags.
  device::device_buffer<int32_t> pools_scratch_;
  device::device_buffer<uint64_t> pool_positions_;
  device::device_buffer<uint64_t> pool_keys_;
  device::device_buffer<row_index_t> pool_rows_;
  device::device_buffer<uint8_t> pool_created_;
  device::device_buffer<uint32_t> miss_partials_;  // per chunk of kMissChunk positions
  device::device_buffer<unsigned long long> miss_count_;
  device::pinned_buffer<unsigned long long> host_misses_;  // miss_count_'s host copy
};

}  // namespace gpubox::card_table
