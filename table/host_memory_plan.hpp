// What the in-process host table keeps in memory under its budget, and what a key costs in each
// place it can live: the planned row budget per shard (from runner.host_memory_mb and
// runner.host_memory_row_budget, the smaller wins) and the bytes per key of a memory row (floats,
// epoch, hash slot at the planned fill) and of a disk row (RocksDB key and value before its own
// overhead). SparseTable::open prints to_string() and sizes its shards from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "table/detail/key_index_map.hpp"
#include "table/host_table_types.hpp"

namespace gpubox::table {

struct HostMemoryPlan {
  uint32_t shards = 0;
  uint64_t rows_per_shard = 0;  // rows a shard keeps in memory at most (0: no limit)
  // Rows per storage chunk of a shard (a power of two, at most RowArena::kMaxRowsPerChunk): about
  // an eighth of the shard's budget, so the part of the last chunk not yet used stays small.
  uint32_t rows_per_chunk = 0;
  std::size_t row_bytes = 0;       // the row's floats
  std::size_t metadata_bytes = 0;  // per row besides its floats (modification epoch)
  // Hash slot bytes per key: at the planned fill when there is a budget, else at the worst fill
  // right after the index doubled.
  double index_bytes_per_key = 0;
  std::size_t disk_bytes_per_key = 0;  // RocksDB key (shard, key) and value (epoch, row)
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
    return static_cast<std::size_t>(shards) * write_through_slots * detail::KeyIndexMap::kSlotBytes;
  }

  uint64_t rows() const { return rows_per_shard * shards; }
  double memory_bytes_per_key() const {
    return static_cast<double>(row_bytes + metadata_bytes) + index_bytes_per_key;
  }
  // "host tier: budget M MiB -> R rows in memory (P per shard, S shards); per key in memory B
  // bytes (row X, epoch Y, index Z), on disk D bytes (+ RocksDB overhead)"; without a budget the
  // budget part reads "no memory budget".
  std::string to_string() const;
};

// The plan for `config` and rows of `stride` floats. A byte budget keeps 1/8 for RocksDB
// (disk_memory_bytes) and about 1/16 for the write-through sets, and gives each shard the rest /
// shards bytes: the most rows whose floats and epochs, plus the hash index sized so that
// those rows and one call's 1/8 more fit below its growth fill, stay within it (at least one row
// a shard; storage grows in chunks of rows_per_chunk rows, so up to one chunk a shard comes on
// top). A row budget
// gives max(1, rows / shards) per shard. Both: the smaller.
HostMemoryPlan plan_host_memory(const HostTableConfig& config, int32_t stride);

}  // namespace gpubox::table
