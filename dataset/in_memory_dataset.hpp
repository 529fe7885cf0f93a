// InMemoryDataset: one pass of training data held in memory (PaddleRec's InMemoryDataset role).
// Knows files and formats, not cards or the model: a "card" here is only an index that picks
// which batches a caller gets.
//
// Tail policy of batch iteration (num_batches_per_card / fill_batch): with N instances, batch
// size B and C cards, every card gets R = ceil(N / (B*C)) batches. Rounds 0..R-2 give every
// card B consecutive instances; the last round's M = N - (R-1)*B*C instances are spread evenly,
// card c getting M/C (+1 for c < M%C). So batch sizes differ by at most one in the last round,
// and a card only gets an empty batch (0 instances) when M < C; that batch must still take part
// in the collectives. Each instance is in exactly one batch per pass.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/batch.hpp"
#include "dataset/dataset_types.hpp"
#include "dataset/instance_block.hpp"
#include "dataset/pass_data_cache.hpp"

namespace gpubox::dataset {

// Instances [begin, end) of the current order that make up one batch.
struct BatchSpan {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
};

// The tail policy above for `n` instances in batches of `batch` over `cards` cards: batches per
// card, and which instances batch `index` of `card` holds.
std::size_t batches_per_card(std::size_t n, std::size_t batch, int cards);
BatchSpan batch_span_of(std::size_t n, std::size_t batch, int card, int cards, std::size_t index);

// Thread-safety: the loading and mutating members (load_into_memory, local_shuffle,
// release_memory, set_*) need exclusive access; the const members may run concurrently, e.g.
// one fill_batch per card thread.
class InMemoryDataset {
 public:
  // Throws gpubox::Error if `config` does not pass validate().
  explicit InMemoryDataset(DatasetConfig config);

  void set_filelist(std::vector<std::string> files) { files_ = std::move(files); }
  void set_thread_num(int threads);
  void set_batch_size(int batch_size);
  const std::vector<std::string>& filelist() const { return files_; }
  const DatasetConfig& config() const { return config_; }

  // Reads every file of the file list with thread_num readers and appends the instances in
  // file-list order (so the result does not depend on thread_num). Large regular files are
  // split into byte ranges read in parallel; piped files are read whole. Malformed lines are
  // skipped and counted (load_stats()), or, with strict_parse, the first one fails the load.
  // On any error (unreadable file, failing pipe_command, strict parse) nothing is added and the
  // Status names the file (and line).
  Status load_into_memory();
  // While set (nullptr: none), a flag that, once true, ends load_into_memory within a few
  // thousand lines of each reader with Status::Aborted and nothing added (a run asked to stop:
  // StepHooks::stop_flag). The flag must outlive the loads.
  void set_stop_flag(const std::atomic<bool>* flag) { stop_flag_ = flag; }
  // While set (nullptr: none), load_into_memory serves a file list loaded before from `cache`
  // when its files are unchanged, and offers what it reads to it (pass_data_cache.hpp: which
  // loads are kept); load_stats() says how many instances came from it. The same records in the
  // same order either way; a load served borrows the cache's blocks (no copy), a load kept shares
  // its blocks with it (shared_bytes()). The cache must outlive the loads and the
  // unique_keys_and_slots() calls while it is set (they offer it the keys they compute); once
  // another cache (or none) is set, the data set keeps what it holds, its blocks and unique keys,
  // and never calls the cache it had again (which may be gone).
  void set_pass_cache(PassDataCache* cache);
  // Statistics of the last load_into_memory (also when it failed).
  const LoadStats& load_stats() const { return stats_; }
  // Seeded permutation of the instance order; the same seed gives the same order.
  void local_shuffle(std::uint64_t seed);
  // Stores the instances in the current order (copied with thread_num threads, the old storage
  // freed after; twice the instances' memory meanwhile): instance(i) stays the same for every
  // i, but a batch's instances, shuffled all over the pass's memory before (a few cache misses
  // each in fill_batch), are then read in sequence. The load order is gone: unique_keys_and_slots
  // then gives each key the slot of its first occurrence in this order. Each block of 65,536
  // instances copied checks the stop flag (set_stop_flag) first: once it is set, the copy ends
  // within a block a thread, the storage and order stay as they were and this returns false.
  bool store_in_order();
  // Drops every instance and returns the memory, but for the blocks others hold too: the pass
  // cache's (shared_bytes()), registered memory sources'.
  void release_memory();

  std::size_t size() const { return order_.size(); }
  // The blocks the instances are read from, in the order they were added.
  const std::vector<SharedInstanceBlock>& blocks() const { return blocks_; }
  // Whether instance(i) is the i-th of blocks()' instances taken one block after another (no
  // local_shuffle since the load, or store_in_order since the last): one pass over the order.
  bool in_block_order() const;
  // Instance at `position` of the current order. The view is valid until the next mutation.
  InstanceRef instance(std::size_t position) const;

  std::size_t num_batches_per_card(int cards) const;
  // Which instances batch `index` of `card` holds (see the tail policy above).
  BatchSpan batch_span(int card, int cards, std::size_t index) const;
  // Builds that batch into `batch`, reusing its storage.
  void fill_batch(int card, int cards, std::size_t index, Batch* batch) const;
  // visit(keys, n) over the key occurrences of positions [begin, end) of the current order, in
  // order, as runs read where they are stored, not copied: a run is the keys of consecutive
  // positions stored one after another (a whole batch when it lies in one block as loaded or
  // after store_in_order; one instance at a time after local_shuffle alone).
  template <class Visit>
  void visit_key_runs(std::size_t begin, std::size_t end, Visit&& visit) const;

  // Distinct keys of all loaded instances, key 0 excluded, in ascending order; computed with
  // thread_num threads (the data set's keys split into 256 ranges of values, each deduplicated
  // and sorted on its own), or those unique_keys_and_slots() holds already (below).
  std::vector<std::uint64_t> unique_keys() const;
  // unique_keys() with each key's slot next to it: the slot_id (dataset_types.hpp) of the slot
  // of the key's first occurrence in load order (files in list order; independent of
  // local_shuffle and thread_num). What begin_pass gives the rows it creates. When the data set
  // holds just one load of the pass cache (served, or kept by it) in load order: the keys the
  // cache served with the load (load_stats().cached_unique_keys), or else computed once, kept by
  // the data set and offered to the cache (pass_data_cache.hpp), so that later loads are served
  // them; otherwise computed on every call.
  UniqueKeys unique_keys_and_slots() const;
  // unique_keys_and_slots() without the copy: for a data set holding just one load of the pass
  // cache, the object it keeps (the cache's too, when the cache served or took it).
  std::shared_ptr<const UniqueKeys> unique_keys_and_slots_shared() const;
  // Distinct keys per slot (a key in two slots counts in both).
  std::vector<std::size_t> unique_keys_per_slot() const;
  // Bytes held by instances and the order index (blocks shared with the pass cache included: the
  // data set keeps them alive too).
  std::size_t memory_bytes() const;
  // The part of memory_bytes() in blocks shared with the pass cache (set_pass_cache) when they
  // were loaded, counted in its bytes too: what releasing this data set alone would not return
  // while the cache keeps its entry (a file of the list changed or gone drops it). Blocks of
  // memory sources (memory_source.hpp), shared with their registration, are not counted here.
  std::size_t shared_bytes() const { return shared_bytes_; }

 private:
  struct Location {
    std::uint32_t block;
    std::uint64_t index;
  };
  Location locate(std::size_t position) const;
  // visit(position, instance) for positions [begin, end) of the current order, in order, each
  // instance's storage prefetched a few positions ahead (after a shuffle, each is a handful of
  // cache misses in several arrays).
  template <class Visit>
  void visit_in_order(std::size_t begin, std::size_t end, Visit&& visit) const;
  // Asks for the cache lines of the row of the instance at `position` (not its keys).
  void prefetch_row(std::size_t position) const;
  // Asks for the line of its key_begin alone (what visit_key_runs reads of a row).
  void prefetch_key_begin(std::size_t position) const;
  // Asks for the lines of its keys; it reads its key_begin, asked for kRowAhead - kKeysAhead
  // positions earlier (prefetch_row or prefetch_key_begin).
  void prefetch_keys(std::size_t position) const;
  // How far ahead, in positions, the rows then the keys of a walk in the current order are asked
  // for.
  static constexpr std::size_t kRowAhead = 16;
  static constexpr std::size_t kKeysAhead = 8;
  // Positions [begin, end) of the current order stored in `out` (empty, of this data set's
  // slots and dense width) in that order: store_in_order's copy of one block.
  void copy_in_order(std::size_t begin, std::size_t end, InstanceBlock* out) const;
  // A loaded block's instances after those already held (in order_, as block id and index);
  // `shared`: the pass cache holds the block too (shared_bytes()).
  void append_block(SharedInstanceBlock block, bool shared);
  // load_into_memory from the pass cache: true when it held the file list (with `identities`).
  bool load_cached(const PassKey& key, const std::vector<FileIdentity>& identities);
  // Called by each load, its stats_ set, before it appends `blocks` (the load's, in order, empty
  // ones too) of `key` (null: not a load of the cache): whether the data set will hold just one
  // load of the cache (cache_load_), and its unique keys when the cache gave them
  // (stats_.cached_unique_keys).
  void note_load(const PassKey* key, const std::vector<SharedInstanceBlock>& blocks,
                 std::shared_ptr<const UniqueKeys> unique_keys);
  // unique_keys_and_slots() computed from the blocks.
  UniqueKeys compute_unique_keys_and_slots() const;

  DatasetConfig config_;
  std::vector<std::string> files_;
  const std::atomic<bool>* stop_flag_ = nullptr;
  PassDataCache* cache_ = nullptr;
  // Immutable once loaded (shared with the pass cache, memory sources): only the order changes.
  std::vector<SharedInstanceBlock> blocks_;
  std::size_t shared_bytes_ = 0;
  // Set while the data set holds just one load of the pass cache (`blocks_` are its blocks, in
  // load order, the empty ones left out): what unique_keys_and_slots offers the cache.
  struct CacheLoad {
    PassDataCache* cache = nullptr;  // the one it came from; null once another is set
    PassKey key;
    std::vector<SharedInstanceBlock> blocks;  // as the cache holds them
    // The const members may run concurrently: the keys are set by the first that asks.
    mutable Mutex mu;
    // The cache's, when it served them; else computed by the first unique_keys_and_slots().
    std::shared_ptr<const UniqueKeys> unique_keys GPUBOX_GUARDED_BY(mu);
  };
  std::unique_ptr<CacheLoad> cache_load_;
  // Current order: (block << kIndexBits) | index inside the block.
  static constexpr int kIndexBits = 40;
  std::vector<std::uint64_t> order_;
  LoadStats stats_;
};

template <class Visit>
void InMemoryDataset::visit_key_runs(std::size_t begin, std::size_t end, Visit&& visit) const {
  GPUBOX_EXPECTS(begin <= end && end <= order_.size(), "visit_key_runs [", begin, ", ", end,
                 ") of ", order_.size());
  std::size_t p = begin;
  while (p < end) {
    // The next position continues the run when it is the next index of the same block.
    std::size_t q = p + 1;
    while (q < end && order_[q] == order_[q - 1] + 1) ++q;
    if (q == p + 1) {
      // A run of one (a shuffled order read through its index): the keys of the positions a
      // few ahead asked for, as visit_in_order does, so that their misses overlap.
      if (p + kRowAhead < end) prefetch_key_begin(p + kRowAhead);
      if (p + kKeysAhead < end) prefetch_keys(p + kKeysAhead);
    }
    const Location at = locate(p);
    const InstanceBlock& block = *blocks_[at.block];
    const std::uint64_t first = block.key_begin[at.index];
    visit(static_cast<const std::uint64_t*>(block.keys.data() + first),
          static_cast<std::size_t>(block.key_begin[at.index + (q - p)] - first));
    p = q;
  }
}

// The batch of `n` instances in this order (CSR per slot, batch.hpp), the layout fill_batch
// builds: the trainer's steps and gpubox_serve's micro-batches are assembled by this one function.
void assemble_batch(const InstanceRef* instances, std::size_t n, int num_slots, int dense_dim,
                    Batch* batch);

}  // namespace gpubox::dataset
