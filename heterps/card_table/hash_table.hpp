// CardHashTable: one card's map from uint64 keys to rows of its RowPool, or of its RowPools when
// rows come in several widths (options.pool_strides: one pool per width class); the value is
// then a handle naming the pool and the row (RowHandleCodec).
//
// Open addressing with linear probing over a power-of-two array of 16-byte slots; the probe
// start is mix64(key) (independent of owner_card's fmix64) rounded down to a cache line. Probing is
// bounded by kMaxProbe; an insert that would go further makes the table grow and retry. Before each
// insert batch the table grows so that (live + erased + batch) / capacity <= max_load_factor, so
// kernels never run out of slots. A rehash (growth, or a purge of erased slots at the same size)
// saves the live (key, row) pairs, frees or empties the slot array, and reinserts: its peak is the
// new array plus 12 bytes per live key, never two slot arrays. Every uint64 key is storable:
// kEmptyKey and kErasedKey, which mark slot states, are kept in two side slots. The probing code
// (detail/probe.cuh) is written once for host and card and driven by parallel_for. Listings
// (dump*, list_slots_async) come in slot order, which hangs on how concurrent inserts interleave:
// unspecified across tables, runs and backends. So are the row handles that follow from a
// listing: the rows CardSparseStore::compact_pool moves, in listing order, onto free rows, and the
// free list's order after it; a key's row handle is no more comparable across tables than its
// slot. This header is the host API (g++ alone compiles it); the device views for functors
// (TableFindRef, TableInsertRef) are in hash_table.cuh.
//
// Bulk API over card ranges (keys/out pointers in this card's memory), stream last. Calls that
// return a count synchronize `stream`; the others are only stream-ordered. `stream` must be the
// card's stream (or ordered with it): buffers grow on the card's stream.
// Not thread-safe: one card thread drives a table. Move-only; owns its slots and its RowPools.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "heterps/card_table/row_pool.hpp"
#include "heterps/card_table/sparse_types.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::card_table {
namespace detail {
struct FindEngine;
struct InsertEngine;
}  // namespace detail
class TableFindRef;    // hash_table.cuh
class TableInsertRef;  // hash_table.cuh

// Card memory a rehash may borrow for the live (key, row) pairs it saves (12 bytes a live key)
// instead of allocating them: a caller's buffers of this card, resized, their contents lost (the
// pass boundary lends its kept listing, pass_cards.hpp). Empty: the rehash makes its own.
struct RehashRoom {
  device::device_buffer<uint64_t>* keys = nullptr;
  device::device_buffer<row_index_t>* rows = nullptr;
};

class CardHashTable {
 public:
  // The card (memory and stream) must outlive the table.
  explicit CardHashTable(device::Card& card, const HashTableOptions& options = {});
  CardHashTable(CardHashTable&&) noexcept = default;
  CardHashTable& operator=(CardHashTable&&) noexcept = default;
  CardHashTable(const CardHashTable&) = delete;
  CardHashTable& operator=(const CardHashTable&) = delete;

  // out_rows[i] = the row of keys[i]; a key not yet present gets a fresh row from the pool
  // (its contents are whatever the pool held: the caller initialises it). Duplicates inside
  // the batch get the same row. When `out_created` is given, out_created[i] = 1 exactly for the
  // one position per new key that created it. Returns how many keys were new. Synchronizes.
  std::size_t insert(const uint64_t* keys, std::size_t n, row_index_t* out_rows,
                     const device::Stream& stream);
  std::size_t insert(const uint64_t* keys, std::size_t n, row_index_t* out_rows,
                     uint8_t* out_created, const device::Stream& stream);
  // insert(), the new keys taking rows of pool `pool` (a key already present keeps its row,
  // whatever its pool).
  std::size_t insert_in_pool(int32_t pool, const uint64_t* keys, std::size_t n,
                             row_index_t* out_rows, uint8_t* out_created,
                             const device::Stream& stream);
  // out_rows[i] = the row of keys[i], kInvalidRow when absent. Stream-ordered.
  void find(const uint64_t* keys, std::size_t n, row_index_t* out_rows,
            const device::Stream& stream) const;
  // Removes the keys (absent ones and repeats are ignored); their rows go back to their pools.
  // When `out_rows` is given, out_rows[i] = the row keys[i] released, else kInvalidRow.
  // Returns how many keys were removed. Synchronizes.
  std::size_t erase(const uint64_t* keys, std::size_t n, const device::Stream& stream,
                    row_index_t* out_rows = nullptr);
  // erase() without a readback, for keys known to be on the card and distinct (the next pass's
  // victims, listed since with nothing inserted or erased): their rows go back to the free list
  // in key order, exactly as erase() puts them, and the host's counts follow from n and
  // `reserved` (how many of the keys are kEmptyKey or kErasedKey: the caller knows its keys).
  // `planned_rows` (card memory, or null: no row check): the row each key had when the caller
  // chose it. *check (card memory) accumulates what differs from that plan: a key that was not
  // there (check->missing; it damages the free list: a kInvalidRow on it) or that was at another
  // row (check->moved; that row is the one freed), and the first such key with both rows.
  // Whoever reads *check late must stop on a nonzero count. One pool only. Stream-ordered: no
  // wait, no allocation.
  void erase_present_async(const uint64_t* keys, const row_index_t* planned_rows, std::size_t n,
                           std::size_t reserved, ErasePresentCheck* check,
                           const device::Stream& stream);
  // How many new keys insert_new_async takes now without growing: within the load bound, and at
  // most the free rows of the pool. Host arithmetic, no card work.
  std::size_t new_key_room() const;
  // insert() of keys known to be absent and distinct (the next pass's staged keys missing on the
  // card), without a readback or an allocation: position i takes the i-th candidate row of the
  // pool, out_rows[i] (card memory) = that row, and the host's counts follow from n. A key that
  // was present after all or met a probe run longer than kMaxProbe adds 1 to *failed (card
  // memory): its key keeps its old row or stays absent, and its candidate row is off the free
  // list but unused; whoever reads *failed late repairs it (find the keys: release_unused the
  // rows that differ, insert() those keys again). Requires n <= new_key_room(); one pool only.
  // Stream-ordered: no wait, no allocation.
  void insert_new_async(const uint64_t* keys, std::size_t n, row_index_t* out_rows,
                        uint32_t* failed, const device::Stream& stream);
  // Gives back rows that insert_new_async handed out but the table did not take (distinct, each
  // off the free list and in no slot). Synchronizes.
  void release_unused(const row_index_t* rows, std::size_t n, const device::Stream& stream);
  // release_unused() of rows known valid (insert_new_async's candidates, read back), without a
  // wait: copied onto the free list's tail, in the order release_unused() puts them. One pool
  // only. Stream-ordered: no wait, no allocation (no Thrust temporaries).
  void release_unused_async(const row_index_t* rows, std::size_t n, const device::Stream& stream);
  // Writes every live (key, row) to keys_out/rows_out (card memory, room for size()), in slot
  // order (this table's now: see above). Returns size(). Synchronizes.
  std::size_t dump(uint64_t* keys_out, row_index_t* rows_out, const device::Stream& stream) const;
  // dump() of the slots [slot_begin, slot_end) only, so a caller can list the table a bounded
  // range at a time (the keys kept in side slots come with the range that ends at capacity()).
  // keys_out/rows_out need room for slot_end - slot_begin + 2 entries. The ranges of one listing
  // are only consistent while nothing is inserted or erased between them. Returns the count.
  // Synchronizes.
  std::size_t dump_range(std::size_t slot_begin, std::size_t slot_end, uint64_t* keys_out,
                         row_index_t* rows_out, const device::Stream& stream) const;
  // dump_range() without the compaction and its count: entry i of [0, slot_end - slot_begin) is
  // slot slot_begin + i, its key as stored and its row, kInvalidRow unless the slot is live;
  // when slot_end is capacity(), two more entries follow, the side slots of kErasedKey and
  // kEmptyKey (kInvalidRow when absent). The live entries, in order, are dump_range()'s output.
  // Returns how many entries it writes (keys_out/rows_out need that room). Stream-ordered: no
  // wait, no allocation.
  std::size_t list_slots_async(std::size_t slot_begin, std::size_t slot_end, uint64_t* keys_out,
                               row_index_t* rows_out, const device::Stream& stream) const;
  // dump() of the entries whose row is in pool `pool` at index `first_row` or above (the rows
  // CardSparseStore::compact_pool moves), in slot order; keys_out/rows_out need room for
  // size(). Returns the count. Synchronizes.
  std::size_t dump_pool_rows_from(int32_t pool, std::size_t first_row, uint64_t* keys_out,
                                  row_index_t* rows_out, const device::Stream& stream) const;
  // keys[i] (present and distinct) takes row rows[i]: its row before is the caller's, neither
  // freed nor counted (CardSparseStore::compact_pool copies it there first). Stream-ordered: no
  // wait, no allocation. A key not in the table (a caller's bug: its real row would keep
  // pointing where the caller frees) is flagged on the card, and the table's next wait on its
  // flags (an insert's, an erase's or a rehash's: at the pass boundary, the inserts after
  // pass::fit_pools) throws gpubox::Error naming the card; the flag stays set.
  void repoint_async(const uint64_t* keys, const row_index_t* rows, std::size_t n,
                     const device::Stream& stream);
  // Removes every key and frees every row (capacity kept). Stream-ordered.
  void clear(const device::Stream& stream);
  // Grows so that an insert batch of up to `new_keys` keys needs no growth, and pool 0 (or
  // `pool`) has `new_keys` free rows. Stream-ordered. A rehash it makes saves its pairs in `room`
  // (when given).
  void reserve(std::size_t new_keys, const device::Stream& stream, RehashRoom room = {});
  void reserve_in_pool(int32_t pool, std::size_t new_keys, const device::Stream& stream,
                       RehashRoom room = {});
  // Slots only: an insert batch of up to `new_keys` keys needs no growth. Stream-ordered.
  void reserve_slots(std::size_t new_keys, const device::Stream& stream, RehashRoom room = {});
  // Reclaims the erased slots (a rehash at the same capacity) when, beside them, `new_keys` more
  // keys would pass the load bound: for a table sized once (a card budget), where new_key_room()
  // counts them against the bound until a rehash. As every rehash, it doubles the capacity (and
  // logs a warning naming the card) if a reinserted key's probe run would pass kMaxProbe: rare at
  // the load bound, and a larger table beats failing the job; that growth is an allocation the
  // card counts. Synchronizes when it rehashes; saves its pairs in `room` (when given).
  void purge_erased_for(std::size_t new_keys, const device::Stream& stream, RehashRoom room = {});
  // Sizes the slot array for `keys` live keys at the load bound and every pool's index for as
  // many rows, once (a card budget): up to that many keys the table grows only where a probe run
  // would pass kMaxProbe (rehash), and a rehash otherwise purges erased slots in place. Rows
  // themselves are still allocated page by page.
  // Synchronizes.
  void reserve_capacity(std::size_t keys, const device::Stream& stream);
  // Slots (a power of two, at least 16) the table uses for `keys` live keys at `max_load_factor`.
  static std::size_t slot_capacity_for(std::size_t keys, double max_load_factor);

  std::size_t size() const { return size_; }
  std::size_t capacity() const { return slots_.size(); }
  // Erased slots not yet reclaimed by a rehash (they count against the load bound).
  std::size_t erased_slots() const { return erased_; }
  // Rehashes that saved their pairs in buffers of their own (no RehashRoom lent), so far.
  std::size_t own_pair_rehashes() const { return own_pair_rehashes_; }
  double load_factor() const { return static_cast<double>(size_ + erased_) / capacity(); }
  std::size_t memory_bytes() const;
  const HashTableOptions& options() const { return options_; }

  int32_t pool_count() const { return static_cast<int32_t>(pools_.size()); }
  RowPool& pool(int32_t c = 0) { return pools_.at(static_cast<std::size_t>(c)); }
  const RowPool& pool(int32_t c = 0) const { return pools_.at(static_cast<std::size_t>(c)); }
  const RowHandleCodec& codec() const { return codec_; }
  // Every pool's rows by handle (card memory). Invalidated by growth.
  RowPoolsRef rows() const;
  device::Card& card() const { return *card_; }

  TableFindRef find_ref() const;
  // Inserts made through this ref are not counted by size() until recount().
  TableInsertRef insert_ref();
  // Recounts live and erased slots (after inserts through insert_ref). Synchronizes.
  std::size_t recount(const device::Stream& stream);

 private:
  detail::FindEngine find_engine() const;
  detail::InsertEngine insert_engine();
  // Rehashes into a table of at least `min_capacity` slots, purging erased slots; doubles (a
  // warning naming the card, past any budget's sizing) while a reinserted key's probe run would
  // pass kMaxProbe. The live pairs go to `room` (when given; else to buffers of its own).
  // Synchronizes.
  void rehash(std::size_t min_capacity, const device::Stream& stream, RehashRoom room = {});
  // flags_[which], read on the host with the others (a wait). Throws when a repoint missed.
  uint32_t read_flag(std::size_t which, const device::Stream& stream) const;

  device::Card* card_;
  HashTableOptions options_;
  RowHandleCodec codec_;
  std::vector<RowPool> pools_;
  device::device_buffer<detail::Slot> slots_;
  // side_rows_[0]: row of kErasedKey, [1]: row of kEmptyKey (kInvalidRow when absent).
  device::device_buffer<row_index_t> side_rows_;
  // Scratch reused across batches: per-position "took its candidate" flags, released rows.
  device::device_buffer<uint8_t> created_scratch_;
  device::device_buffer<row_index_t> rows_scratch_;
  // A probe overflowed, reserved keys erased (each zeroed before the launch that sets it), and a
  // repoint missed its key (zeroed once: the table is corrupt from then on).
  enum Flag : std::size_t { kProbeOverflow, kReservedErased, kRepointMissed, kFlagCount };
  device::device_buffer<uint32_t> flags_;
  std::size_t size_ = 0;
  std::size_t erased_ = 0;
  std::size_t own_pair_rehashes_ = 0;
};

}  // namespace gpubox::card_table
