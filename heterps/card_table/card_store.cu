#include <thrust/copy.h>
#include <thrust/find.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/partition.h>
#include <thrust/remove.h>
#include <thrust/scan.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/tuple.h>

#include <algorithm>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/card_table/detail/record_copies.cuh"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/parallel_for.cuh"

namespace gpubox::card_table {
namespace {

using detail::GatherRecords;
using detail::ScatterRecords;

// A row written from the host tier is clean.
struct MarkClean {
  const row_index_t* rows;
  DirtyFlagsRef dirty;
  GPUBOX_HD void operator()(std::size_t i) const { dirty[rows[i]] = 0; }
};

// out[i] = the address of the row with handle rows[i].
struct RowAddresses {
  RowPoolsRef pools;
  const row_index_t* rows;
  const float** out;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = pools.row(rows[i]); }
};

// pools[i] = the width class of record i, by the width it records (-1: none of the config's).
struct RecordPools {
  const float* records;
  int32_t record_stride;
  int32_t mf_dim_offset;
  table::WidthClasses classes;
  int32_t* pools;
  GPUBOX_HD void operator()(std::size_t i) const {
    const float width = records[i * static_cast<std::size_t>(record_stride) + mf_dim_offset];
    pools[i] = classes.class_of(static_cast<int32_t>(width));
  }
};

// pools[j] = the width class of the slot of missing position j (slot 0 without slots).
struct SlotPools {
  const int32_t* missing_slots;  // slot of missing key j (null: slot 0)
  table::AccessorConfig config;
  table::WidthClasses classes;
  int32_t* pools;
  GPUBOX_HD void operator()(std::size_t j) const {
    const int32_t slot = missing_slots ? missing_slots[j] : 0;
    pools[j] = classes.class_of(table::slot_mf_dim(config, slot));
  }
};

// out[order[j]] = the slot of the first occurrence of missing key order[j]: with the missing keys
// sorted stably (order[j] = index of the j-th), run_first[j] is the lowest index of its key's
// run, and missing keys are in batch order.
struct FirstOccurrenceSlots {
  const int32_t* slots;
  const uint64_t* positions;
  const uint64_t* order;
  const uint64_t* run_first;
  int32_t* out;
  GPUBOX_HD void operator()(std::size_t j) const { out[order[j]] = slots[positions[run_first[j]]]; }
};

struct InPool {
  const int32_t* pools;
  int32_t pool;
  GPUBOX_HD bool operator()(uint64_t i) const { return pools[i] == pool; }
};

// The pool-grouped insert's results back at their positions.
struct UngroupRows {
  const uint64_t* positions;
  const row_index_t* grouped_rows;
  const uint8_t* grouped_created;
  row_index_t* rows;
  uint8_t* created;  // may be null
  GPUBOX_HD void operator()(std::size_t j) const {
    rows[positions[j]] = grouped_rows[j];
    if (created != nullptr) created[positions[j]] = grouped_created[j];
  }
};

// Misses are counted by work items of kMissChunk positions each (interleaved: item t counts t,
// t + items, ..., so neighbouring items read neighbouring positions), one partial count per
// item and no atomics, then one thread sums the partials: a batch of new keys (every key a
// miss) no longer sends every thread to one counter.
constexpr std::size_t kMissChunk = 256;

struct CountChunkMisses {
  const row_index_t* rows;
  std::size_t n;
  std::size_t items;
  uint32_t* partials;
  GPUBOX_HD void operator()(std::size_t item) const {
    uint32_t misses = 0;
    for (std::size_t i = item; i < n; i += items) misses += rows[i] == kInvalidRow ? 1u : 0u;
    partials[item] = misses;
  }
};

struct SumChunkMisses {
  const uint32_t* partials;
  std::size_t chunks;
  unsigned long long* total;
  GPUBOX_HD void operator()(std::size_t) const {
    unsigned long long sum = 0;
    for (std::size_t c = 0; c < chunks; ++c) sum += partials[c];
    *total = sum;
  }
};

struct IsMissing {
  GPUBOX_HD bool operator()(row_index_t row) const { return row == kInvalidRow; }
};

struct GatherKeys {
  const uint64_t* keys;
  const uint64_t* positions;
  uint64_t* out;
  GPUBOX_HD void operator()(std::size_t j) const { out[j] = keys[positions[j]]; }
};

// Scatters the rows of the missing keys back to their positions; the position that created a
// row initialises it (accessor rules, at its slot's width: the row's pool) and marks it dirty:
// the host tier does not have it yet.
struct ScatterCreated {
  const uint64_t* missing_keys;
  const uint64_t* positions;
  const row_index_t* missing_rows;
  const uint8_t* created;
  const int32_t* missing_slots;  // as SlotPools'
  row_index_t* out;
  RowPoolsRef pages;
  DirtyFlagsRef dirty;
  table::AccessorConfig config;
  GPUBOX_HD void operator()(std::size_t j) const {
    const row_index_t r = missing_rows[j];
    const uint64_t position = positions[j];
    out[position] = r;
    if (!created[j]) return;
    const int32_t slot = missing_slots ? missing_slots[j] : 0;
    table::init_row(pages.row(r), table::RowLayout::for_slot(config, slot), config, missing_keys[j],
                    slot);
    dirty[r] = 1;
  }
};

struct IsCleanEntry {
  DirtyFlagsRef dirty;
  template <class Tuple>
  GPUBOX_HD bool operator()(const Tuple& entry) const {
    return dirty[thrust::get<1>(entry)] == 0;
  }
};

// The table's options for `config`: one pool, of the record stride, when every row has one width;
// else a pool per width class, each at its rows' stride.
HashTableOptions store_table_options(const table::AccessorConfig& config,
                                     const HashTableOptions& options) {
  HashTableOptions o = options;
  o.row_stride = table::record_layout(config).stride();
  o.pool_strides.clear();
  const table::WidthClasses classes = table::width_classes(config);
  if (classes.count > 1) {
    for (int32_t c = 0; c < classes.count; ++c) {
      o.pool_strides.push_back(
          table::RowLayout::make(config.optimizer.kind, classes.dims[c], config.storage).stride());
    }
  }
  return o;
}

}  // namespace

CardSparseStore::CardSparseStore(device::Card& card, const table::AccessorConfig& config,
                                 const HashTableOptions& options, EvictionPolicy eviction)
    : config_(config),
      layout_(table::record_layout(config)),
      classes_(table::width_classes(config)),
      eviction_(eviction),
      table_(card, store_table_options(config, options)),
      rows_scratch_(0, card.memory(), card.stream()),
      created_scratch_(0, card.memory(), card.stream()),
      keys_scratch_(0, card.memory(), card.stream()),
      positions_scratch_(0, card.memory(), card.stream()),
      pools_scratch_(0, card.memory(), card.stream()),
      pool_positions_(0, card.memory(), card.stream()),
      pool_keys_(0, card.memory(), card.stream()),
      pool_rows_(0, card.memory(), card.stream()),
      pool_created_(0, card.memory(), card.stream()),
      miss_partials_(0, card.memory(), card.stream()),
      miss_count_(1, card.memory(), card.stream()),
      host_misses_(1) {
  host_misses_[0] = 0;
  GPUBOX_EXPECTS(config.mf_dim >= 0, "mf_dim must be >= 0, got ", config.mf_dim);
  for (int32_t c = 0; c < table_.pool_count(); ++c) {
    dirty_.emplace_back(0, card.memory(), card.stream());
  }
  sync_dirty_capacity(card.stream());
}

std::size_t CardSparseStore::memory_bytes() const {
  std::size_t dirty = 0;
  for (const auto& flags : dirty_) dirty += flags.capacity();
  return table_.memory_bytes() + dirty + rows_scratch_.capacity() * sizeof(row_index_t) +
         created_scratch_.capacity() +
         (keys_scratch_.capacity() + positions_scratch_.capacity()) * sizeof(uint64_t) +
         pools_scratch_.capacity() * sizeof(int32_t) +
         (pool_positions_.capacity() + pool_keys_.capacity()) * sizeof(uint64_t) +
         pool_rows_.capacity() * sizeof(row_index_t) + pool_created_.capacity() +
         miss_partials_.capacity() * sizeof(uint32_t) +
         miss_count_.capacity() * sizeof(unsigned long long);
}

void CardSparseStore::sync_dirty_capacity(const device::Stream& stream) {
  for (int32_t c = 0; c < table_.pool_count(); ++c) {
    device::device_buffer<uint8_t>& dirty = dirty_[static_cast<std::size_t>(c)];
    const std::size_t old_size = dirty.size();
    const std::size_t rows = table_.pool(c).capacity();
    if (old_size >= rows) continue;
    dirty.resize(rows);
    device::memset_bytes_async(dirty.data() + old_size, 0, rows - old_size, stream);
  }
}

DirtyFlagsRef CardSparseStore::dirty_flags() const {
  DirtyFlagsRef dirty;
  dirty.codec = table_.codec();
  // Writable view; the const callers (list_entries) only read through it.
  for (std::size_t c = 0; c < dirty_.size(); ++c) {
    dirty.pools[c] = const_cast<uint8_t*>(dirty_[c].data());
  }
  return dirty;
}

CardStoreRef CardSparseStore::ref() {
  return CardStoreRef(table_.rows(), dirty_flags(), table_.find_ref(), layout_);
}

void CardSparseStore::reserve(std::size_t new_keys, const device::Stream& stream, RehashRoom room) {
  // With several pools the keys' classes are not known here: their rows come at insert.
  if (table_.pool_count() == 1) {
    table_.reserve(new_keys, stream, room);
  } else {
    table_.reserve_slots(new_keys, stream, room);
  }
  sync_dirty_capacity(stream);
}

void CardSparseStore::reserve_capacity(std::size_t keys, const device::Stream& stream) {
  table_.reserve_capacity(keys, stream);
  for (int32_t c = 0; c < table_.pool_count(); ++c) {
    const std::size_t page_rows = table_.pool(c).page_rows();
    dirty_[static_cast<std::size_t>(c)].reserve((keys + page_rows - 1) / page_rows * page_rows);
  }
}

std::size_t CardSparseStore::insert_by_pool(const uint64_t* keys, std::size_t n,
                                            const int32_t* pools, row_index_t* out_rows,
                                            uint8_t* out_created, const device::Stream& stream) {
  pool_positions_.resize_discard(n);
  pool_keys_.resize_discard(n);
  pool_rows_.resize_discard(n);
  pool_created_.resize_discard(n);
  // Positions grouped by pool (stable: a pool's keys keep their order).
  std::vector<std::size_t> starts(1, 0);
  for (int32_t c = 0; c < table_.pool_count(); ++c) {
    uint64_t* first = pool_positions_.data() + starts.back();
    uint64_t* end = device::host_result(stream, [&] {
      return thrust::copy_if(device::exec_policy(stream), thrust::counting_iterator<uint64_t>(0),
                             thrust::counting_iterator<uint64_t>(n), first, InPool{pools, c});
    });
    starts.push_back(starts.back() + static_cast<std::size_t>(end - first));
  }
  if (starts.back() != n) {
    const std::vector<int32_t> host_pools = device::to_host(pools, n, stream);
    const auto bad = static_cast<std::size_t>(std::find(host_pools.begin(), host_pools.end(), -1) -
                                              host_pools.begin());
    const uint64_t key = device::to_host(keys + bad, 1, stream)[0];
    GPUBOX_FAIL(
        "card ", card().rank(), ": the row of key ", key,
        " has an embedx width that no slot of this config has (hyper_parameters.slot_dims)");
  }
  device::parallel_for(stream, n, GatherKeys{keys, pool_positions_.data(), pool_keys_.data()});
  std::size_t inserted = 0;
  for (int32_t c = 0; c < table_.pool_count(); ++c) {
    const std::size_t b = starts[static_cast<std::size_t>(c)];
    const std::size_t count = starts[static_cast<std::size_t>(c) + 1] - b;
    inserted += table_.insert_in_pool(c, pool_keys_.data() + b, count, pool_rows_.data() + b,
                                      pool_created_.data() + b, stream);
  }
  device::parallel_for(stream, n,
                       UngroupRows{pool_positions_.data(), pool_rows_.data(), pool_created_.data(),
                                   out_rows, out_created});
  stream.synchronize();
  return inserted;
}

void CardSparseStore::scatter_records(const float* records, const row_index_t* rows, std::size_t n,
                                      const device::Stream& stream) {
  const int32_t stride = record_stride();
  device::parallel_for(stream, n * static_cast<std::size_t>(stride),
                       ScatterRecords{table_.rows(), records, rows, n, stride});
}

std::size_t CardSparseStore::insert_rows(const uint64_t* keys, const float* rows, std::size_t n,
                                         const device::Stream& stream, row_index_t* row_room) {
  if (n == 0) return 0;
  row_index_t* handles = row_room;
  if (handles == nullptr) {
    rows_scratch_.resize_discard(n);
    handles = rows_scratch_.data();
  }
  std::size_t inserted = 0;
  if (table_.pool_count() == 1) {
    inserted = table_.insert(keys, n, handles, stream);
  } else {
    pools_scratch_.resize_discard(n);
    device::parallel_for(stream, n,
                         RecordPools{rows, record_stride(), layout_.mf_dim_offset(), classes_,
                                     pools_scratch_.data()});
    inserted = insert_by_pool(keys, n, pools_scratch_.data(), handles, nullptr, stream);
  }
  sync_dirty_capacity(stream);
  scatter_records(rows, handles, n, stream);
  device::parallel_for(stream, n, MarkClean{handles, dirty_flags()});
  return inserted;
}

void CardSparseStore::insert_new_rows_async(const uint64_t* keys, const float* rows, std::size_t n,
                                            row_index_t* rows_out, uint32_t* failed,
                                            const device::Stream& stream) {
  if (n == 0) return;
  // The pool does not grow (no allocation here): its dirty flags already cover it. Checked
  // before the keys claim their slots, so a failure leaves no key without its record.
  GPUBOX_EXPECTS(dirty_[0].size() >= table_.pool(0).capacity(), "card ", card().rank(),
                 ": dirty flags for ", dirty_[0].size(), " rows, pool of ",
                 table_.pool(0).capacity());
  table_.insert_new_async(keys, n, rows_out, failed, stream);
  scatter_records(rows, rows_out, n, stream);
  device::parallel_for(stream, n, MarkClean{rows_out, dirty_flags()});
}

void CardSparseStore::read_rows(const uint64_t* keys, std::size_t n, float* rows_out,
                                const device::Stream& stream) const {
  if (n == 0) return;
  rows_scratch_.resize_discard(n);
  table_.find(keys, n, rows_scratch_.data(), stream);
  const row_index_t* first = rows_scratch_.data();
  const row_index_t* missing = device::host_result(stream, [&] {
    return thrust::find(device::exec_policy(stream), first, first + n, kInvalidRow);
  });
  if (missing != first + n) {
    const std::size_t position = static_cast<std::size_t>(missing - first);
    const uint64_t key = device::to_host(keys + position, 1, stream)[0];
    GPUBOX_FAIL("card ", card().rank(), ": read_rows: key ", key, " (position ", position, " of ",
                n, ") is not on the card");
  }
  gather_rows(first, n, rows_out, stream);
  stream.synchronize();
}

void CardSparseStore::lookup_or_create(const uint64_t* keys, const int32_t* slots, std::size_t n,
                                       row_index_t* out_row_indices, bool create_missing,
                                       std::size_t* created, const device::Stream& stream) {
  if (created != nullptr) *created = 0;
  if (n == 0) return;
  // Pulls mostly hit: find everything first, then insert only the misses, so a batch of known
  // keys never makes the table grow.
  if (!create_missing) {
    table_.find(keys, n, out_row_indices, stream);
    stream.synchronize();
    return;
  }
  lookup_async(keys, n, out_row_indices, stream);
  stream.synchronize();
  const std::size_t missing = misses();
  if (missing == 0) return;
  const std::size_t inserted =
      create_missing_rows(keys, slots, n, out_row_indices, missing, stream);
  if (created != nullptr) *created = inserted;
}

void CardSparseStore::lookup_async(const uint64_t* keys, std::size_t n,
                                   row_index_t* out_row_indices, const device::Stream& stream) {
  if (n == 0) {
    host_misses_[0] = 0;
    return;
  }
  table_.find(keys, n, out_row_indices, stream);
  count_misses(out_row_indices, n, stream);
  device::copy_async(host_misses_.data(), miss_count_.data(), 1, stream);
}

void CardSparseStore::lookup_on_card(const uint64_t* keys, std::size_t n,
                                     row_index_t* out_row_indices, const device::Stream& stream) {
  if (n == 0) {
    device::memset_bytes_async(miss_count_.data(), 0, sizeof(unsigned long long), stream);
    return;
  }
  table_.find(keys, n, out_row_indices, stream);
  count_misses(out_row_indices, n, stream);
}

std::size_t CardSparseStore::create_missing_rows(const uint64_t* keys, const int32_t* slots,
                                                 std::size_t n, row_index_t* out_row_indices,
                                                 std::size_t missing,
                                                 const device::Stream& stream) {
  if (missing == 0) return 0;
  auto exec = device::exec_policy(stream);
  positions_scratch_.resize_discard(missing);
  keys_scratch_.resize_discard(missing);
  rows_scratch_.resize_discard(missing);
  created_scratch_.resize_discard(missing);
  device::host_result(stream, [&] {
    return thrust::copy_if(exec, thrust::counting_iterator<uint64_t>(0),
                           thrust::counting_iterator<uint64_t>(n), out_row_indices,
                           positions_scratch_.data(), IsMissing{});
  });
  device::parallel_for(stream, missing,
                       GatherKeys{keys, positions_scratch_.data(), keys_scratch_.data()});
  // The slot each new row is created with: a key repeated in the batch takes its first
  // occurrence's (the lowest position), as every tier does (table/sparse_row/accessor.hpp:
  // slot_dims). Only with slots and a repeated missing key; allocates (kCreate's creation).
  device::device_buffer<int32_t> missing_slots = card().make_buffer<int32_t>(0);
  if (slots != nullptr) {
    missing_slots.resize_discard(missing);
    device::device_buffer<uint64_t> sorted_keys = card().make_buffer<uint64_t>(missing);
    device::device_buffer<uint64_t> order = card().make_buffer<uint64_t>(missing);
    device::device_buffer<uint64_t> run_first = card().make_buffer<uint64_t>(missing);
    device::before_thrust_call(stream);  // `exec` was made before GatherKeys
    thrust::copy(exec, keys_scratch_.data(), keys_scratch_.data() + missing, sorted_keys.data());
    thrust::sequence(exec, order.data(), order.data() + missing);
    thrust::stable_sort_by_key(exec, sorted_keys.data(), sorted_keys.data() + missing,
                               order.data());
    thrust::inclusive_scan_by_key(exec, sorted_keys.data(), sorted_keys.data() + missing,
                                  order.data(), run_first.data(), thrust::equal_to<uint64_t>(),
                                  thrust::minimum<uint64_t>());
    device::parallel_for(stream, missing,
                         FirstOccurrenceSlots{slots, positions_scratch_.data(), order.data(),
                                              run_first.data(), missing_slots.data()});
    stream.synchronize();  // before the sort's buffers go
  }
  const int32_t* created_slots = slots != nullptr ? missing_slots.data() : nullptr;
  std::size_t inserted = 0;
  if (table_.pool_count() == 1) {
    inserted = table_.insert(keys_scratch_.data(), missing, rows_scratch_.data(),
                             created_scratch_.data(), stream);
  } else {
    pools_scratch_.resize_discard(missing);
    device::parallel_for(stream, missing,
                         SlotPools{created_slots, config_, classes_, pools_scratch_.data()});
    inserted = insert_by_pool(keys_scratch_.data(), missing, pools_scratch_.data(),
                              rows_scratch_.data(), created_scratch_.data(), stream);
  }
  sync_dirty_capacity(stream);
  device::parallel_for(stream, missing,
                       ScatterCreated{keys_scratch_.data(), positions_scratch_.data(),
                                      rows_scratch_.data(), created_scratch_.data(), created_slots,
                                      out_row_indices, table_.rows(), dirty_flags(), config_});
  stream.synchronize();
  return inserted;
}

void CardSparseStore::reserve_lookups(std::size_t n) {
  miss_partials_.reserve((n + kMissChunk - 1) / kMissChunk);
}

void CardSparseStore::count_misses(const row_index_t* rows, std::size_t n,
                                   const device::Stream& stream) {
  const std::size_t chunks = (n + kMissChunk - 1) / kMissChunk;
  miss_partials_.resize_discard(chunks);
  device::parallel_for(stream, chunks, CountChunkMisses{rows, n, chunks, miss_partials_.data()});
  device::parallel_for(stream, 1,
                       SumChunkMisses{miss_partials_.data(), chunks, miss_count_.data()});
}

std::size_t CardSparseStore::list_entries_range(std::size_t slot_begin, std::size_t slot_end,
                                                device::device_buffer<uint64_t>& keys_out,
                                                device::device_buffer<row_index_t>& rows_out,
                                                const device::Stream& stream) const {
  const std::size_t room = slot_end > slot_begin ? slot_end - slot_begin + 2 : 2;
  keys_out.resize_discard(room);
  rows_out.resize_discard(room);
  const std::size_t count =
      table_.dump_range(slot_begin, slot_end, keys_out.data(), rows_out.data(), stream);
  keys_out.resize(count);
  rows_out.resize(count);
  return count;
}

std::size_t CardSparseStore::list_entries(bool dirty_only,
                                          device::device_buffer<uint64_t>& keys_out,
                                          device::device_buffer<row_index_t>& rows_out,
                                          const device::Stream& stream) const {
  const std::size_t live = table_.size();
  keys_out.resize_discard(live);
  rows_out.resize_discard(live);
  table_.dump(keys_out.data(), rows_out.data(), stream);
  if (!dirty_only) return live;
  // Stable in-place compaction: the dirty entries move to the front, keys and rows together.
  auto first = thrust::make_zip_iterator(thrust::make_tuple(keys_out.data(), rows_out.data()));
  const DirtyFlagsRef dirty = dirty_flags();
  auto end = device::host_result(stream, [&] {
    return thrust::remove_if(device::exec_policy(stream), first, first + live, IsCleanEntry{dirty});
  });
  const auto count = static_cast<std::size_t>(end - first);
  keys_out.resize(count);
  rows_out.resize(count);
  return count;
}

void CardSparseStore::gather_rows(const row_index_t* rows, std::size_t n, float* rows_out,
                                  const device::Stream& stream) const {
  const int32_t stride = record_stride();
  device::parallel_for(stream, n * static_cast<std::size_t>(stride),
                       GatherRecords{table_.rows(), rows, n, rows_out, stride});
}

void CardSparseStore::row_addresses(const row_index_t* rows, std::size_t n,
                                    const float** addresses_out,
                                    const device::Stream& stream) const {
  device::parallel_for(stream, n, RowAddresses{table_.rows(), rows, addresses_out});
}

std::size_t CardSparseStore::collect(bool dirty_only, device::device_buffer<uint64_t>& keys_out,
                                     device::device_buffer<float>& rows_out,
                                     const device::Stream& stream) const {
  device::device_buffer<row_index_t> rows(0, card().memory(), stream);
  const std::size_t count = list_entries(dirty_only, keys_out, rows, stream);
  rows_out.resize_discard(count * static_cast<std::size_t>(layout_.stride()));
  gather_rows(rows.data(), count, rows_out.data(), stream);
  stream.synchronize();
  return count;
}

std::size_t CardSparseStore::collect_dirty(device::device_buffer<uint64_t>& keys_out,
                                           device::device_buffer<float>& rows_out,
                                           const device::Stream& stream) const {
  return collect(/*dirty_only=*/true, keys_out, rows_out, stream);
}

std::size_t CardSparseStore::collect_all(device::device_buffer<uint64_t>& keys_out,
                                         device::device_buffer<float>& rows_out,
                                         const device::Stream& stream) const {
  return collect(/*dirty_only=*/false, keys_out, rows_out, stream);
}

void CardSparseStore::clear_dirty(const device::Stream& stream) {
  for (auto& flags : dirty_) device::memset_bytes_async(flags.data(), 0, flags.size(), stream);
}

void CardSparseStore::clear_dirty(const row_index_t* rows, std::size_t n,
                                  const device::Stream& stream) {
  if (n == 0) return;
  device::parallel_for(stream, n, MarkClean{rows, dirty_flags()});
}

void CardSparseStore::clear(const device::Stream& stream) {
  table_.clear(stream);
  clear_dirty(stream);
}

}  // namespace gpubox::card_table
