// CardHashTable (hash_table.hpp): its slots and row pools, growth (reserve, rehash), insert, find
// and erase with their wait-free forms, repoint, recount and clear. Listing the table (dump*,
// list_slots_async) is hash_table_dump.cu.
#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/tuple.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "heterps/card_table/hash_table.cuh"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/parallel_for.cuh"

namespace gpubox::card_table {
namespace {

using detail::InsertEngine;
using detail::InsertStatus;
using detail::IsLiveKey;
using detail::Slot;

using detail::kPrefetchDistance;

constexpr std::size_t kMinCapacity = 16;

std::size_t next_pow2(std::size_t x) {
  std::size_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

struct FillEmpty {
  Slot* slots;
  GPUBOX_HD void operator()(std::size_t i) const { slots[i] = Slot{kEmptyKey, kInvalidRow, 0}; }
};

struct FindKeys {
  detail::FindEngine engine;
  const uint64_t* keys;
  row_index_t* out;
  std::size_t n;
  GPUBOX_HD void operator()(std::size_t i) const {
    if (i + kPrefetchDistance < n) engine.prefetch(keys[i + kPrefetchDistance]);
    out[i] = engine.find(keys[i]);
  }
};

// Position i takes candidate i when its key is new. Positions already resolved by an earlier
// attempt (out[i] != kInvalidRow) are skipped, so a retry after growth keeps their rows.
struct InsertKeys {
  InsertEngine engine;
  detail::FindEngine prefetcher;
  const uint64_t* keys;
  const row_index_t* candidates;
  row_index_t* out;
  uint8_t* created;
  uint32_t* overflow;
  std::size_t n;
  bool retry;
  GPUBOX_HD void operator()(std::size_t i) const {
    if (i + kPrefetchDistance < n) prefetcher.prefetch(keys[i + kPrefetchDistance]);
    if (retry && out[i] != kInvalidRow) return;
    const detail::InsertResult r = engine.insert(keys[i], candidates[i]);
    out[i] = r.row;
    created[i] = r.status == InsertStatus::kInserted ? 1 : 0;
    if (r.status == InsertStatus::kProbeBoundExceeded) {
      detail::atomic_ref<uint32_t>(*overflow).store(1, cuda::memory_order_relaxed);
    }
  }
};

struct EraseKeys {
  InsertEngine engine;
  const uint64_t* keys;
  row_index_t* released;
  uint32_t* reserved_erased;
  GPUBOX_HD void operator()(std::size_t i) const {
    const uint64_t key = keys[i];
    const row_index_t row = engine.erase(key);
    released[i] = row;
    if (row != kInvalidRow && detail::is_reserved_key(key)) {
      detail::atomic_ref<uint32_t>(*reserved_erased).fetch_add(1, cuda::memory_order_relaxed);
    }
  }
};

// erase_present_async: each key's row straight onto the free list's tail (free_tail[i]), as
// RowPool::release would append it; a key not found, or found at another row than planned,
// counts into *check, and the first such key is reported with both rows.
struct ErasePresent {
  InsertEngine engine;
  const uint64_t* keys;
  const row_index_t* planned;  // may be null: no row check
  row_index_t* free_tail;
  ErasePresentCheck* check;
  GPUBOX_HD void operator()(std::size_t i) const {
    const row_index_t row = engine.erase(keys[i]);
    free_tail[i] = row;
    const bool missing = row == kInvalidRow;
    if (!missing && (planned == nullptr || planned[i] == row)) return;
    detail::atomic_ref<uint32_t>(missing ? check->missing : check->moved)
        .fetch_add(1, cuda::memory_order_relaxed);
    uint32_t none = 0;
    if (detail::atomic_ref<uint32_t>(check->reported)
            .compare_exchange_strong(none, 2, cuda::memory_order_relaxed)) {
      // Claimed (2: being written); 1 once the fields are there, for whoever reads it later in
      // stream order.
      check->key = keys[i];
      check->planned_row = planned != nullptr ? planned[i] : kInvalidRow;
      check->found_row = row;
      detail::atomic_ref<uint32_t>(check->reported).store(1, cuda::memory_order_release);
    }
  }
};

// insert_new_async: position i takes candidate i; a key that could not take it is counted.
struct InsertNew {
  InsertEngine engine;
  const uint64_t* keys;
  const row_index_t* candidates;
  row_index_t* out;
  uint32_t* failed;
  GPUBOX_HD void operator()(std::size_t i) const {
    const row_index_t candidate = candidates[i];
    out[i] = candidate;
    if (engine.insert(keys[i], candidate).status != InsertStatus::kInserted) {
      detail::atomic_ref<uint32_t>(*failed).fetch_add(1, cuda::memory_order_relaxed);
    }
  }
};

// Puts the (key, row) pairs saved by a rehash into the emptied slot array.
struct Reinsert {
  const uint64_t* keys;
  const row_index_t* rows;
  InsertEngine engine;
  uint32_t* overflow;
  GPUBOX_HD void operator()(std::size_t i) const {
    if (engine.insert(keys[i], rows[i]).status == InsertStatus::kProbeBoundExceeded) {
      detail::atomic_ref<uint32_t>(*overflow).store(1, cuda::memory_order_relaxed);
    }
  }
};

struct SlotKey {
  GPUBOX_HD uint64_t operator()(const Slot& s) const { return s.key; }
};
struct SlotRow {
  GPUBOX_HD row_index_t operator()(const Slot& s) const { return s.row; }
};
struct IsLiveEntry {
  template <class Tuple>
  GPUBOX_HD bool operator()(const Tuple& t) const {
    return IsLiveKey{}(thrust::get<0>(t));
  }
};
struct IsErasedSlot {
  GPUBOX_HD bool operator()(const Slot& s) const { return s.key == kErasedKey; }
};
struct IsLiveSlot {
  GPUBOX_HD bool operator()(const Slot& s) const { return IsLiveKey{}(s.key); }
};

// repoint_async: keys[i] takes rows[i]; a key not in the table sets *missed.
struct RepointKeys {
  InsertEngine engine;
  const uint64_t* keys;
  const row_index_t* rows;
  uint32_t* missed;
  GPUBOX_HD void operator()(std::size_t i) const {
    if (!engine.repoint(keys[i], rows[i])) {
      detail::atomic_ref<uint32_t>(*missed).store(1, cuda::memory_order_relaxed);
    }
  }
};
}  // namespace

namespace {
std::vector<RowPool> make_pools(device::Card& card, const HashTableOptions& options,
                                RowHandleCodec codec) {
  std::vector<int32_t> strides = options.pool_strides;
  if (strides.empty()) strides.push_back(options.row_stride);
  GPUBOX_EXPECTS(static_cast<int32_t>(strides.size()) <= kMaxRowPools,
                 "hash table: ", strides.size(), " row pools asked, at most ", kMaxRowPools);
  std::vector<RowPool> pools;
  pools.reserve(strides.size());
  for (std::size_t c = 0; c < strides.size(); ++c) {
    pools.emplace_back(card, strides[c], options.initial_rows, options.page_rows, codec,
                       static_cast<int32_t>(c));
  }
  return pools;
}
}  // namespace

CardHashTable::CardHashTable(device::Card& card, const HashTableOptions& options)
    : card_(&card),
      options_(options),
      codec_(RowHandleCodec::for_pools(
          std::max<int32_t>(1, static_cast<int32_t>(options.pool_strides.size())))),
      pools_(make_pools(card, options, codec_)),
      slots_(0, card.memory(), card.stream(), device::Pages::kHuge),  // probed at random
      side_rows_(2, card.memory(), card.stream()),
      created_scratch_(0, card.memory(), card.stream()),
      rows_scratch_(0, card.memory(), card.stream()),
      flags_(kFlagCount, card.memory(), card.stream()) {
  GPUBOX_EXPECTS(options.max_load_factor > 0.0 && options.max_load_factor <= 0.9,
                 "hash table max_load_factor must be in (0, 0.9], got ", options.max_load_factor);
  const device::Stream& stream = card.stream();
  slots_.resize_discard(slot_capacity_for(options.initial_capacity, 1.0));
  device::parallel_for(stream, slots_.size(), FillEmpty{slots_.data()});
  const row_index_t none[2] = {kInvalidRow, kInvalidRow};
  device::copy_async(side_rows_.data(), none, 2, stream);
  device::memset_bytes_async(flags_.data(), 0, flags_.bytes(), stream);
  stream.synchronize();
}

uint32_t CardHashTable::read_flag(std::size_t which, const device::Stream& stream) const {
  const std::vector<uint32_t> flags = device::to_host(flags_.data(), kFlagCount, stream);
  GPUBOX_EXPECTS(flags[kRepointMissed] == 0, "card ", card_->rank(),
                 ": a compaction (CardSparseStore::compact_pool) moved the row of a key the table "
                 "does not hold, so a key may still point into a freed page: the card's table is "
                 "corrupt");
  return flags[which];
}

detail::FindEngine CardHashTable::find_engine() const {
  return detail::FindEngine{slots_.data(), slots_.size() - 1, side_rows_.data()};
}
detail::InsertEngine CardHashTable::insert_engine() {
  return detail::InsertEngine{slots_.data(), slots_.size() - 1, side_rows_.data()};
}
TableFindRef CardHashTable::find_ref() const { return TableFindRef(find_engine()); }
TableInsertRef CardHashTable::insert_ref() { return TableInsertRef(insert_engine()); }

RowPoolsRef CardHashTable::rows() const {
  RowPoolsRef ref;
  ref.codec = codec_;
  for (std::size_t c = 0; c < pools_.size(); ++c) ref.pools[c] = pools_[c].rows();
  return ref;
}

std::size_t CardHashTable::memory_bytes() const {
  std::size_t pools = 0;
  for (const RowPool& pool : pools_) pools += pool.memory_bytes();
  return slots_.capacity() * sizeof(Slot) + side_rows_.capacity() * sizeof(row_index_t) +
         created_scratch_.capacity() + rows_scratch_.capacity() * sizeof(row_index_t) +
         flags_.capacity() * sizeof(uint32_t) + pools;
}

std::size_t CardHashTable::slot_capacity_for(std::size_t keys, double max_load_factor) {
  const auto want =
      static_cast<std::size_t>(std::ceil(static_cast<double>(keys) / max_load_factor));
  return next_pow2(std::max(kMinCapacity, want));
}

void CardHashTable::reserve(std::size_t new_keys, const device::Stream& stream, RehashRoom room) {
  reserve_in_pool(0, new_keys, stream, room);
}

void CardHashTable::reserve_in_pool(int32_t pool, std::size_t new_keys,
                                    const device::Stream& stream, RehashRoom room) {
  reserve_slots(new_keys, stream, room);
  this->pool(pool).reserve_free(new_keys, stream);
}

void CardHashTable::reserve_slots(std::size_t new_keys, const device::Stream& stream,
                                  RehashRoom room) {
  GPUBOX_EXPECTS(new_keys <= kMaxRows, "card ", card_->rank(), ": batch of ", new_keys,
                 " keys exceeds the table's row limit ", kMaxRows);
  const double bound = options_.max_load_factor * static_cast<double>(capacity());
  if (static_cast<double>(size_ + erased_ + new_keys) > bound) {
    // Rehash purges erased slots, so size only the live keys plus the batch.
    rehash(std::max(slot_capacity_for(size_ + new_keys, options_.max_load_factor), capacity()),
           stream, room);
  }
}

void CardHashTable::purge_erased_for(std::size_t new_keys, const device::Stream& stream,
                                     RehashRoom room) {
  const double bound = options_.max_load_factor * static_cast<double>(capacity());
  if (erased_ == 0 || static_cast<double>(size_ + erased_ + new_keys) <= bound) return;
  rehash(capacity(), stream, room);
}

void CardHashTable::reserve_capacity(std::size_t keys, const device::Stream& stream) {
  GPUBOX_EXPECTS(keys <= kMaxRows, "card ", card_->rank(), ": ", keys,
                 " keys exceed the table's row limit ", kMaxRows);
  const std::size_t slots = slot_capacity_for(keys, options_.max_load_factor);
  if (slots > capacity()) rehash(slots, stream);
  for (RowPool& pool : pools_) pool.reserve_index(keys);
}

void CardHashTable::rehash(std::size_t min_capacity, const device::Stream& stream,
                           RehashRoom room) {
  // The live (key, row) pairs leave the slot array first (12 bytes per live key, at most 0.45x the
  // array at the load bound); the old array is freed before the new one is allocated, or reused
  // when the capacity stays (a purge of erased slots). Peak: new array + pairs, where copying
  // slot to slot would hold both arrays (1.5x the new one when doubling, 2x when purging).
  const Slot* slots = slots_.data();
  const auto live = static_cast<std::size_t>(
      thrust::count_if(device::exec_policy(stream), slots, slots + slots_.size(), IsLiveSlot{}));
  // Made (empty: nothing allocated) even when borrowed, so both cases read the same below.
  device::device_buffer<uint64_t> own_keys(0, card_->memory(), card_->stream());
  device::device_buffer<row_index_t> own_rows(0, card_->memory(), card_->stream());
  device::device_buffer<uint64_t>& keys = room.keys != nullptr ? *room.keys : own_keys;
  device::device_buffer<row_index_t>& rows = room.rows != nullptr ? *room.rows : own_rows;
  if (room.keys == nullptr || room.rows == nullptr) ++own_pair_rehashes_;
  keys.resize_discard(live);
  rows.resize_discard(live);
  auto first = thrust::make_zip_iterator(
      thrust::make_tuple(thrust::make_transform_iterator(slots, SlotKey{}),
                         thrust::make_transform_iterator(slots, SlotRow{})));
  thrust::copy_if(device::exec_policy(stream), first, first + slots_.size(),
                  thrust::make_zip_iterator(thrust::make_tuple(keys.data(), rows.data())),
                  IsLiveEntry{});
  std::size_t new_capacity = next_pow2(std::max(kMinCapacity, min_capacity));
  for (;;) {
    if (new_capacity != slots_.size()) {
      slots_.release();
      slots_.resize_discard(new_capacity);
    }
    device::parallel_for(stream, new_capacity, FillEmpty{slots_.data()});
    device::memset_bytes_async(flags_.data() + kProbeOverflow, 0, sizeof(uint32_t), stream);
    device::parallel_for(
        stream, live,
        Reinsert{keys.data(), rows.data(), insert_engine(), flags_.data() + kProbeOverflow});
    if (read_flag(kProbeOverflow, stream) == 0) break;
    // A probe run longer than kMaxProbe: spread the keys further. Rare at the load bound; a
    // table sized once for a card budget then outgrows its plan, which the user is told.
    GPUBOX_LOG(WARNING) << "card " << card_->rank() << ": a rehash of " << live << " keys into "
                        << new_capacity << " slots met a probe run past " << kMaxProbe
                        << " slots: the table doubles to " << 2 * new_capacity
                        << " slots (beyond any card memory budget's sizing)";
    new_capacity *= 2;
  }
  erased_ = 0;
}

std::size_t CardHashTable::insert(const uint64_t* keys, std::size_t n, row_index_t* out_rows,
                                  const device::Stream& stream) {
  return insert_in_pool(0, keys, n, out_rows, nullptr, stream);
}

std::size_t CardHashTable::insert(const uint64_t* keys, std::size_t n, row_index_t* out_rows,
                                  uint8_t* out_created, const device::Stream& stream) {
  return insert_in_pool(0, keys, n, out_rows, out_created, stream);
}

std::size_t CardHashTable::insert_in_pool(int32_t pool, const uint64_t* keys, std::size_t n,
                                          row_index_t* out_rows, uint8_t* out_created,
                                          const device::Stream& stream) {
  if (n == 0) return 0;
  reserve_in_pool(pool, n, stream);
  RowPool& rows = this->pool(pool);
  uint8_t* created = out_created;
  if (created == nullptr) {
    created_scratch_.resize_discard(n);
    created = created_scratch_.data();
  }
  const row_index_t* candidates = rows.peek_free(n);
  for (bool retry = false;; retry = true) {
    device::memset_bytes_async(flags_.data() + kProbeOverflow, 0, sizeof(uint32_t), stream);
    device::parallel_for(stream, n,
                         InsertKeys{insert_engine(), find_engine(), keys, candidates, out_rows,
                                    created, flags_.data() + kProbeOverflow, n, retry});
    if (read_flag(kProbeOverflow, stream) == 0) break;
    // Some key met a probe run longer than kMaxProbe: grow and insert the keys that failed.
    rehash(capacity() * 2, stream);
  }
  const std::size_t inserted = rows.commit_allocation(created, n, stream);
  size_ += inserted;
  return inserted;
}

void CardHashTable::find(const uint64_t* keys, std::size_t n, row_index_t* out_rows,
                         const device::Stream& stream) const {
  device::parallel_for(stream, n, FindKeys{find_engine(), keys, out_rows, n});
}

std::size_t CardHashTable::erase(const uint64_t* keys, std::size_t n, const device::Stream& stream,
                                 row_index_t* out_rows) {
  if (n == 0) return 0;
  row_index_t* released = out_rows;
  if (released == nullptr) {
    rows_scratch_.resize_discard(n);
    released = rows_scratch_.data();
  }
  uint32_t* reserved_erased = flags_.data() + kReservedErased;
  device::memset_bytes_async(reserved_erased, 0, sizeof(uint32_t), stream);
  device::parallel_for(stream, n, EraseKeys{insert_engine(), keys, released, reserved_erased});
  std::size_t removed = 0;
  for (RowPool& pool : pools_) removed += pool.release(released, n, stream);
  const std::size_t reserved_removed = read_flag(kReservedErased, stream);
  size_ -= removed;
  erased_ += removed - reserved_removed;
  return removed;
}

void CardHashTable::erase_present_async(const uint64_t* keys, const row_index_t* planned_rows,
                                        std::size_t n, std::size_t reserved,
                                        ErasePresentCheck* check, const device::Stream& stream) {
  if (n == 0) return;
  GPUBOX_EXPECTS(pools_.size() == 1, "card ", card_->rank(),
                 ": erase_present_async needs one row pool, the table has ", pools_.size());
  GPUBOX_EXPECTS(n <= size_ && reserved <= n && reserved <= 2, "card ", card_->rank(), ": erasing ",
                 n, " keys known present (", reserved, " reserved) from a table of ", size_);
  row_index_t* tail = pools_[0].append_free(n);
  device::parallel_for(stream, n, ErasePresent{insert_engine(), keys, planned_rows, tail, check});
  size_ -= n;
  erased_ += n - reserved;  // the reserved keys leave their side slots, no tombstone
}

std::size_t CardHashTable::new_key_room() const {
  if (pools_.size() != 1) return 0;
  const auto bound =
      static_cast<std::size_t>(options_.max_load_factor * static_cast<double>(capacity()));
  const std::size_t slots = bound > size_ + erased_ ? bound - size_ - erased_ : 0;
  return std::min(slots, pools_[0].free_count());
}

void CardHashTable::insert_new_async(const uint64_t* keys, std::size_t n, row_index_t* out_rows,
                                     uint32_t* failed, const device::Stream& stream) {
  if (n == 0) return;
  GPUBOX_EXPECTS(pools_.size() == 1, "card ", card_->rank(),
                 ": insert_new_async needs one row pool, the table has ", pools_.size());
  GPUBOX_EXPECTS(n <= new_key_room(), "card ", card_->rank(), ": inserting ", n,
                 " new keys without growth, room for ", new_key_room(), " (table of ", size_,
                 " keys, ", erased_, " erased slots, ", capacity(), " slots, ",
                 pools_[0].free_count(), " free rows)");
  const row_index_t* candidates = pools_[0].peek_free(n);
  device::parallel_for(stream, n, InsertNew{insert_engine(), keys, candidates, out_rows, failed});
  pools_[0].take_free(n);
  size_ += n;
}

void CardHashTable::release_unused(const row_index_t* rows, std::size_t n,
                                   const device::Stream& stream) {
  if (n == 0) return;
  const std::size_t released = pools_.at(0).release(rows, n, stream);
  GPUBOX_EXPECTS(released == n, "card ", card_->rank(), ": gave back ", released, " of ", n,
                 " unused rows (an invalid row among them)");
  size_ -= n;  // insert_new_async counted them as keys
}

void CardHashTable::release_unused_async(const row_index_t* rows, std::size_t n,
                                         const device::Stream& stream) {
  if (n == 0) return;
  GPUBOX_EXPECTS(pools_.size() == 1, "card ", card_->rank(),
                 ": release_unused_async needs one row pool, the table has ", pools_.size());
  GPUBOX_EXPECTS(n <= size_, "card ", card_->rank(), ": giving back ", n,
                 " unused rows, the table counts ", size_, " keys");
  device::copy_async(pools_[0].append_free(n), rows, n, stream);
  size_ -= n;  // insert_new_async counted them as keys
}

void CardHashTable::repoint_async(const uint64_t* keys, const row_index_t* rows, std::size_t n,
                                  const device::Stream& stream) {
  device::parallel_for(stream, n,
                       RepointKeys{insert_engine(), keys, rows, flags_.data() + kRepointMissed});
}

std::size_t CardHashTable::recount(const device::Stream& stream) {
  const Slot* slots = slots_.data();
  const auto live = static_cast<std::size_t>(
      thrust::count_if(device::exec_policy(stream), slots, slots + slots_.size(), IsLiveSlot{}));
  erased_ = static_cast<std::size_t>(
      thrust::count_if(device::exec_policy(stream), slots, slots + slots_.size(), IsErasedSlot{}));
  const std::vector<row_index_t> side = device::to_host(side_rows_.data(), 2, stream);
  size_ = live + (side[0] != kInvalidRow) + (side[1] != kInvalidRow);
  return size_;
}

void CardHashTable::clear(const device::Stream& stream) {
  device::parallel_for(stream, slots_.size(), FillEmpty{slots_.data()});
  const row_index_t none[2] = {kInvalidRow, kInvalidRow};
  device::copy_async(side_rows_.data(), none, 2, stream);
  for (RowPool& pool : pools_) pool.clear(stream);
  stream.synchronize();  // `none` lives on this stack frame
  size_ = 0;
  erased_ = 0;
}

}  // namespace gpubox::card_table
