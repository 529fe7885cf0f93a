// What the in-process host table keeps in memory under its budget, and what a key costs in each
// place it can live: the planned row budget per shard (from runner.host_memory_mb and
// runner.host_memory_row_budget, the smaller wins) and the bytes per key of a memory row (floats,
// epoch, hash slot at the planned fill) and of a disk row (RocksDB key and value before its own
// overhead). SparseTable::open computes it once, prints to_string() and sizes its shards from it.
//
// Width classes (hyper_parameters.slot_dims): rows take their own class's stride, and how many
// rows of each class a shard will hold is not known in advance. The plan assumes a mix (each
// class's share of the rows: planned_classes) to size the row count and the index, and also
// gives each shard a limit on its rows' bytes (floats and epochs): eviction keeps both, so the
// byte budget holds whatever the real mix is (a wider mix keeps fewer rows, a narrower one
// leaves bytes unused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "table/host_table_types.hpp"
#include "table/key_index_map.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::table {

// One width class as the plan sees it: its embedx width, floats per row, and the share of the
// rows assumed to be of it (the shares add up to 1).
struct PlannedClass {
  int32_t mf_dim = 0;
  int32_t stride = 0;
  double share = 0;
};

// The width classes of `accessor` with their shares: with `key_slots` (the sparse slots keys come
// from, HostTableConfig::key_slots) > 0, each slot is assumed to bring the same number of rows, so
// a class's share is its slots' count / key_slots (slot_dims slots numbered 1..key_slots; the
// rest are the default width's); with 0 (unknown), every row is assumed at the widest class,
// which can only overstate the bytes.
std::vector<PlannedClass> planned_classes(const AccessorConfig& accessor, uint32_t key_slots);

struct HostMemoryPlan {
  uint32_t shards = 0;
  uint64_t rows_per_shard = 0;  // rows a shard keeps in memory at most (0: no limit)
  // Bytes of the rows (floats and epochs) a shard keeps in memory at most (0: no limit): the
  // byte budget's share of a shard less its index. Binds before rows_per_shard only when the
  // rows are wider on average than planned.
  uint64_t row_bytes_per_shard = 0;
  // Slots of a shard's key index for rows_per_shard and one piece more below the growth fill
  // (0: no budget). Under a byte budget the shard reserves them when it opens and after a
  // clear(), so that the index never grows (a growth briefly holds the old and the new slots,
  // 1.5 times the new); under a row budget alone the index grows with the rows up to them.
  std::size_t index_slots = 0;
  std::vector<PlannedClass> classes;
  // Rows per storage chunk of a shard (a power of two, at most RowArena::kMaxRowsPerChunk): about
  // an eighth of the shard's rows over its width classes (each class grows its own chunks), so
  // the parts of the last chunks not yet used stay small.
  uint32_t rows_per_chunk = 0;
  double row_bytes = 0;              // the row's floats (averaged over the classes by share)
  std::size_t metadata_bytes = 0;    // per row besides its floats (modification epoch)
  std::size_t widest_row_bytes = 0;  // floats and metadata of a row of the widest class
  // Hash slot bytes per key: at the planned fill when there is a budget, else at the worst fill
  // right after the index doubled.
  double index_bytes_per_key = 0;
  // RocksDB key (shard, key) and value (epoch, row at its own width), averaged by share.
  double disk_bytes_per_key = 0;
  // RocksDB's memtables and block cache (DiskTier::open): 1/8 of a byte budget, taken from it
  // before the rows are planned; DiskTier::kDefaultMemoryBytes without one.
  std::size_t disk_memory_bytes = 0;
  // Write-through set (SparseShard): keys of pinned rows that eviction sent to disk, so that
  // their push writes them over the disk copy without reading it first. At most
  // write_through_keys_per_shard keys a shard, in a map of write_through_slots slots (never
  // grown past them); 1/16 of a byte budget, or a quarter of the row budget's keys. 0: none
  // (no budget, or a budget too small for a 16-slot map).
  uint64_t write_through_keys_per_shard = 0;
  std::size_t write_through_slots = 0;

  std::size_t write_through_bytes() const {
    return static_cast<std::size_t>(shards) * write_through_slots * KeyIndexMap::kSlotBytes;
  }

  uint64_t rows() const { return rows_per_shard * shards; }
  double memory_bytes_per_key() const {
    return row_bytes + static_cast<double>(metadata_bytes) + index_bytes_per_key;
  }
  // "host tier: R rows in memory at most (P per shard, S shards), M MiB, ...; per key in memory
  // B bytes (row X, epoch Y, index Z), on disk D bytes before RocksDB's own overhead; index ..."
  // (without a budget the first part reads "no memory budget"), then the classes' mix.
  std::string to_string() const;
};

// The plan for `config` and rows of `classes`. A byte budget keeps 1/8 for RocksDB
// (disk_memory_bytes) and about 1/16 for the write-through sets, and gives each shard the rest /
// shards bytes: the most rows of the planned average width whose floats and epochs, plus the
// hash index sized so that those rows and one call's 1/8 more fit below its growth fill, stay
// within it (at least one row a shard); the rows' bytes are limited to the shard's bytes less its
// index (row_bytes_per_shard). Storage grows in chunks of rows_per_chunk rows, so up to one
// chunk a class and shard comes on top. A row budget gives max(1, rows / shards) per shard. Both:
// the smaller.
HostMemoryPlan plan_host_memory(const HostTableConfig& config,
                                const std::vector<PlannedClass>& classes);
// One class of rows of `stride` floats.
HostMemoryPlan plan_host_memory(const HostTableConfig& config, int32_t stride);
// The least memory_budget_bytes plan_host_memory keeps within for `config`'s shards and the
// widest of `classes`: after RocksDB's and the write-through sets' shares, a 16-slot index and
// one row of the widest class a shard. Under it the plan still keeps one row and a 16-slot index
// a shard, past the budget, and says nothing.
uint64_t smallest_memory_budget(const HostTableConfig& config,
                                const std::vector<PlannedClass>& classes);

}  // namespace gpubox::table
