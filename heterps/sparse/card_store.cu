#include <thrust/copy.h>
#include <thrust/find.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/remove.h>
#include <thrust/tuple.h>

#include "common/error.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/parallel_for.cuh"
#include "heterps/sparse/card_store.cuh"

namespace gpubox::sparse {
namespace {

// A row written from the host tier is clean.
struct MarkClean {
  const row_index_t* rows;
  uint8_t* dirty;
  GPUBOX_HD void operator()(std::size_t i) const { dirty[rows[i]] = 0; }
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

struct RowScores {
  RowPagesRef pages;
  const row_index_t* rows;
  float* scores;
  table::AccessorConfig config;
  GPUBOX_HD void operator()(std::size_t i) const {
    scores[i] = table::row_score(pages.row(rows[i]), config);
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
// row initialises it (accessor rules) and marks it dirty: the host tier does not have it yet.
struct ScatterCreated {
  const uint64_t* missing_keys;
  const uint64_t* positions;
  const row_index_t* missing_rows;
  const uint8_t* created;
  const int32_t* slots;
  row_index_t* out;
  RowPagesRef pages;
  uint8_t* dirty;
  table::RowLayout layout;
  table::AccessorConfig config;
  GPUBOX_HD void operator()(std::size_t j) const {
    const row_index_t r = missing_rows[j];
    const uint64_t position = positions[j];
    out[position] = r;
    if (!created[j]) return;
    table::init_row(pages.row(r), layout, config, missing_keys[j], slots ? slots[position] : 0);
    dirty[r] = 1;
  }
};

struct IsCleanEntry {
  const uint8_t* dirty;
  template <class Tuple>
  GPUBOX_HD bool operator()(const Tuple& entry) const {
    return dirty[thrust::get<1>(entry)] == 0;
  }
};

}  // namespace

CardSparseStore::CardSparseStore(device::Card& card, const table::AccessorConfig& config,
                                 const HashTableOptions& options)
    : config_(config),
      layout_(table::record_layout(config)),
      table_(card,
             [&] {
               HashTableOptions o = options;
               o.row_stride = table::record_layout(config).stride();
               return o;
             }()),
      dirty_(0, card.memory(), card.stream()),
      rows_scratch_(0, card.memory(), card.stream()),
      created_scratch_(0, card.memory(), card.stream()),
      keys_scratch_(0, card.memory(), card.stream()),
      positions_scratch_(0, card.memory(), card.stream()),
      miss_partials_(0, card.memory(), card.stream()),
      miss_count_(1, card.memory(), card.stream()),
      host_misses_(1) {
  host_misses_[0] = 0;
  GPUBOX_EXPECTS(config.mf_dim >= 0, "mf_dim must be >= 0, got ", config.mf_dim);
  sync_dirty_capacity(card.stream());
}

std::size_t CardSparseStore::memory_bytes() const {
  return table_.memory_bytes() + dirty_.capacity() +
         rows_scratch_.capacity() * sizeof(row_index_t) + created_scratch_.capacity() +
         (keys_scratch_.capacity() + positions_scratch_.capacity()) * sizeof(uint64_t) +
         miss_partials_.capacity() * sizeof(uint32_t) +
         miss_count_.capacity() * sizeof(unsigned long long);
}

void CardSparseStore::sync_dirty_capacity(const device::Stream& stream) {
  const std::size_t old_size = dirty_.size();
  const std::size_t rows = table_.pool().capacity();
  if (old_size >= rows) return;
  dirty_.resize(rows);
  device::memset_bytes_async(dirty_.data() + old_size, 0, rows - old_size, stream);
}

CardStoreRef CardSparseStore::ref() {
  return CardStoreRef(table_.pool().rows(), dirty_.data(), table_.find_ref(), layout_);
}

void CardSparseStore::reserve(std::size_t new_keys, const device::Stream& stream) {
  table_.reserve(new_keys, stream);
  sync_dirty_capacity(stream);
}

void CardSparseStore::reserve_capacity(std::size_t keys, const device::Stream& stream) {
  table_.reserve_capacity(keys, stream);
  const std::size_t page_rows = table_.pool().page_rows();
  dirty_.reserve((keys + page_rows - 1) / page_rows * page_rows);
}

std::size_t CardSparseStore::insert_rows(const uint64_t* keys, const float* rows, std::size_t n,
                                         const device::Stream& stream) {
  if (n == 0) return 0;
  rows_scratch_.resize_discard(n);
  const std::size_t inserted = table_.insert(keys, n, rows_scratch_.data(), stream);
  sync_dirty_capacity(stream);
  table_.pool().scatter(rows, rows_scratch_.data(), n, stream);
  device::parallel_for(stream, n, MarkClean{rows_scratch_.data(), dirty_.data()});
  return inserted;
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
  table_.pool().gather(first, n, rows_out, stream);
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
  const std::size_t inserted = table_.insert(keys_scratch_.data(), missing, rows_scratch_.data(),
                                             created_scratch_.data(), stream);
  sync_dirty_capacity(stream);
  device::parallel_for(
      stream, missing,
      ScatterCreated{keys_scratch_.data(), positions_scratch_.data(), rows_scratch_.data(),
                     created_scratch_.data(), slots, out_row_indices, table_.pool().rows(),
                     dirty_.data(), layout_, config_});
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
  auto end = device::host_result(stream, [&] {
    return thrust::remove_if(device::exec_policy(stream), first, first + live,
                             IsCleanEntry{dirty_.data()});
  });
  const auto count = static_cast<std::size_t>(end - first);
  keys_out.resize(count);
  rows_out.resize(count);
  return count;
}

void CardSparseStore::gather_rows(const row_index_t* rows, std::size_t n, float* rows_out,
                                  const device::Stream& stream) const {
  table_.pool().gather(rows, n, rows_out, stream);
}

void CardSparseStore::row_scores(const row_index_t* rows, std::size_t n, float* scores_out,
                                 const device::Stream& stream) const {
  device::parallel_for(stream, n, RowScores{table_.pool().rows(), rows, scores_out, config_});
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
  device::memset_bytes_async(dirty_.data(), 0, dirty_.size(), stream);
}

void CardSparseStore::clear_dirty(const row_index_t* rows, std::size_t n,
                                  const device::Stream& stream) {
  if (n == 0) return;
  device::parallel_for(stream, n, MarkClean{rows, dirty_.data()});
}

std::size_t CardSparseStore::erase(const uint64_t* keys, std::size_t n,
                                   const device::Stream& stream) {
  // A released row's dirty flag is stale but harmless: whoever takes the row next sets it.
  return table_.erase(keys, n, stream);
}

void CardSparseStore::clear(const device::Stream& stream) {
  table_.clear(stream);
  clear_dirty(stream);
}

}  // namespace gpubox::sparse
